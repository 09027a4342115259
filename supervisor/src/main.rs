//! `salus-supervisor`: the process users start under `--isolation tenant`
//! (`salus-server` execs into it). It links no TensorFlow: its code reaches
//! no TensorFlow symbol, so the linker leaves the libraries out. Devices are
//! listed and jobs run by `salus-server` children (`probe-devices`,
//! `executor`) beside it.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};

use salus_node::config::Config;
use salus_node::node_start::{NodeStart, Role};
use salus_node::process::{self, Listeners, SERVER_BIN};
use salus_node::runtime::device_list;
use salus_node::supervisor::executors::ExecutorSpec;
use salus_node::supervisor::keeper::{self, HeldListeners};
use salus_node::tenant::CheckpointRoot;

fn main() -> anyhow::Result<()> {
    // A keeper of a stopped supervisor's listening sockets (supervisor::keeper).
    if std::env::var_os(keeper::ENV).is_some() {
        keeper::keep();
    }
    salus_node::tf_env::prepare();
    let mut stderr = std::fs::File::from(std::io::stderr().as_fd().try_clone_to_owned()?);
    let panic_stderr = stderr.try_clone()?;
    std::panic::set_hook(Box::new(move |info| {
        let _ = writeln!(&panic_stderr, "salus-supervisor: {info}");
    }));
    let args = process::parse_args_or_exit(&mut stderr);
    if args.command.is_some() {
        let _ = writeln!(
            stderr,
            "salus-supervisor: subcommands are salus-server's: run salus-server"
        );
        std::process::exit(2);
    }
    let config = process::config_or_exit(args, &mut stderr);
    if !config.isolate_tenants {
        let _ = writeln!(
            stderr,
            "salus-supervisor serves --isolation tenant; run salus-server for --isolation none"
        );
        std::process::exit(2);
    }
    let server_bin = match process::beside_this_binary(SERVER_BIN) {
        Ok(path) => path,
        Err(message) => {
            let _ = writeln!(stderr, "salus-supervisor: {message}");
            std::process::exit(1);
        }
    };
    process::set_up_serving(&config, stderr.try_clone()?);
    // Before any thread: the sockets systemd or an upgrade passed (and the
    // variables that name them, removed).
    let passed = salus_node::listen_fds::take();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Err(err) = runtime.block_on(run(config, server_bin, passed)) {
        let _ = writeln!(stderr, "salus-server: {err:#}");
        std::process::exit(1);
    }
    Ok(())
}

async fn run(
    config: Config,
    server_bin: std::path::PathBuf,
    passed: salus_node::listen_fds::Activated,
) -> anyhow::Result<()> {
    let probe_bin = server_bin.clone();
    let start = NodeStart::begin(config, &Role::Supervisor, move |_| {
        device_list::list_in_child(probe_bin)
    })
    .await?;
    let config = &start.config;
    // Executors outlive this process where the next supervisor can find them:
    // in the state directory's rendezvous.
    let rendezvous = match (&config.state_dir, config.adopt_grace.is_zero()) {
        (Some(dir), false) => Some(process::rendezvous_dir(dir)?),
        (None, false) => {
            tracing::warn!("no state directory: executors end with this supervisor (a restart ends every job)");
            None
        }
        (_, true) => None,
    };
    let restartable = rendezvous.is_some();
    let listeners = Listeners::open(config, passed, rendezvous.as_deref()).await?;
    let addr = listeners.announce()?;
    // Copies of the listening sockets, for whoever serves them after this process.
    let held = HeldListeners {
        api: keeper::dup_fd(listeners.api.as_raw_fd())?,
        metrics: match &listeners.metrics {
            Some(m) => Some(keeper::dup_fd(m.as_raw_fd())?),
            None => None,
        },
    };
    let adopt_grace = config.adopt_grace;
    // systemd keeps a socket it passed in across a restart: no keeper then.
    let keep_sockets = !listeners.activated;
    let spec = ExecutorSpec {
        exe: server_bin.clone(),
        checkpoint_base: match &config.tenant.checkpoints {
            CheckpointRoot::PerJob(base) => Some(base.clone()),
            CheckpointRoot::Shared(_) => None,
        },
        checkpoint_root: match &config.tenant.checkpoints {
            CheckpointRoot::Shared(dir) => Some(dir.clone()),
            CheckpointRoot::PerJob(_) => None,
        },
        args: config.loaded.child_args.clone(),
        memory_limit: config.executor_memory,
        idle_timeout: config.executor_idle_timeout,
        lane_hold_limit: config.lane_hold_limit,
        silence_limit: config.silence_limit,
        start_timeout: std::time::Duration::from_secs(120),
        verbose: config.verbose > 0,
        log_rate: config.executor_log_rate,
        rendezvous: rendezvous.clone(),
        uid_pool: start.uid_pool.clone(),
    };
    tracing::info!(%addr, isolation = "tenant", "serving tensorflow.MasterService, tensorflow.eager.EagerService, tensorflow.WorkerService (GetStatus, RecvTensor) and salus.v1.Admin");
    let stop = salus_node::supervisor::serve(
        start,
        listeners.api,
        spec,
        listeners.metrics,
        process::stop_signal(restartable),
    )
    .await?;
    match (stop, &rendezvous) {
        (process::Stop::Upgrade, _) => {
            let err = upgrade_in_place(&server_bin, &held);
            // Still this process: the executors wait for a supervisor; the
            // sockets go to a keeper as on a restart.
            tracing::error!("the upgrade cannot exec {}: {err}", server_bin.display());
        }
        (process::Stop::Restart, _) => {}
        (process::Stop::Full, _) => {
            tracing::info!("stopped");
            return Ok(());
        }
    }
    if let (Some(dir), true) = (&rendezvous, keep_sockets) {
        // By the path found at the start (this binary's file may be replaced by now).
        let this = server_bin.with_file_name(process::SUPERVISOR_BIN);
        match keeper::hand_to_keeper(&this, dir, &held, adopt_grace) {
            Ok(pid) => tracing::info!(keeper = pid, "the listening sockets wait for the next supervisor"),
            Err(err) => tracing::warn!(cause = %err, "cannot keep the listening sockets: clients are refused until the next supervisor listens"),
        }
    }
    tracing::info!("stopped; the executors wait for the next supervisor");
    // Nothing to wait for: calls in flight through this process end with it,
    // and everything it keeps is saved already.
    std::process::exit(0)
}

/// Execs `salus-server` (its file as it is now: the operator may have
/// replaced it) with this process's arguments, pid and listening sockets
/// (`LISTEN_FDS`, as systemd passes them). Returns only on failure.
fn upgrade_in_place(server_bin: &std::path::Path, held: &HeldListeners) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let api = held.api.as_raw_fd();
    let metrics = held.metrics.as_ref().map(|m| m.as_raw_fd());
    let mut command = std::process::Command::new(server_bin);
    command
        .args(std::env::args_os().skip(1))
        .env("LISTEN_PID", std::process::id().to_string())
        .env("LISTEN_FDS", if metrics.is_some() { "2" } else { "1" })
        .env(salus_node::listen_fds::UPGRADED_ENV, "1")
        .env("LISTEN_FDNAMES", if metrics.is_some() { "api:metrics" } else { "api" });
    // SAFETY: dup2 only, right before the exec (which replaces every thread).
    unsafe {
        command.pre_exec(move || {
            let a = libc::fcntl(api, libc::F_DUPFD_CLOEXEC, 10);
            let m = metrics.map_or(0, |m| libc::fcntl(m, libc::F_DUPFD_CLOEXEC, 10));
            if a < 0 || m < 0 || libc::dup2(a, 3) < 0 || (metrics.is_some() && libc::dup2(m, 4) < 0) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.exec()
}
