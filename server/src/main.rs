//! `salus-server` binary: flags, logging, signals; everything else is in the
//! library. Under `--isolation tenant` (the default) it execs into
//! `salus-supervisor`, which links no TensorFlow, and runs again only as that
//! supervisor's children (`executor`, `probe-devices`).

use std::io::Write;
use std::os::unix::process::CommandExt;

use anyhow::Context;
use salus_server::config::{Command, Config};
use salus_server::frontend::admin::AdminService;
use salus_server::process::{self, Listeners, SUPERVISOR_BIN};
use salus_server::server::Server;

mod malloc_hooks;

/// Redirects stderr before TensorFlow's libraries load and log (see `tf_log`).
#[used]
#[link_section = ".preinit_array"]
static EARLY_REDIRECT: unsafe extern "C" fn(
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) = salus_server::tf_log::early_redirect;

fn main() -> anyhow::Result<()> {
    // A tenant's executor becomes its tenant's user before anything else runs.
    let executor = salus_server::executor::is_executor_invocation();
    if executor {
        if let Err(err) = salus_server::executor::drop_privileges() {
            eprintln!("salus-server executor: {err}");
            std::process::exit(1);
        }
    } else if let Ok(args) = salus_server::config::Args::try_parse_with_config_file() {
        if let Some(Command::Ctl { args: ctl_args }) = &args.command {
            legacy_ctl(ctl_args.clone());
        }
        if args.command.is_none() && args.isolation == salus_server::config::Isolation::Tenant {
            become_supervisor();
        }
    }
    salus_server::tf_env::prepare();
    // fd 2 may be a filtered pipe now: messages printed right before exiting go
    // to the real stderr directly, or the filter thread could lose them.
    let mut stderr =
        salus_server::tf_log::filter_stderr().context("cannot set up log filtering")?;
    let panic_stderr = stderr.try_clone()?;
    std::panic::set_hook(Box::new(move |info| {
        let _ = writeln!(&panic_stderr, "salus-server: {info}");
    }));
    let args = process::parse_args_or_exit(&mut stderr);
    let executor = executor && matches!(args.command, Some(Command::Executor));
    let probe = matches!(args.command, Some(Command::ProbeDevices));
    if let Some(Command::Ctl { args: ctl_args }) = &args.command {
        legacy_ctl(ctl_args.clone());
    }
    let config = process::config_or_exit(args, &mut stderr);
    process::set_up_serving(&config, stderr.try_clone()?);
    malloc_hooks::enable_block_cache(config.block_cache_bytes);
    if !salus_server::heap_meter::install() {
        tracing::warn!("the malloc hooks are not in effect: eager jobs' per-iteration memory will not be measured");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if probe {
        match runtime.block_on(salus_server::server::probe_devices(config)) {
            Ok(line) => println!("{line}"),
            Err(err) => {
                let _ = writeln!(stderr, "salus-server probe-devices: {err}");
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    if executor {
        if let Err(err) = runtime.block_on(salus_server::executor::run(config, process::shutdown_signal())) {
            let _ = writeln!(stderr, "salus-server executor: {err}");
            std::process::exit(1);
        }
        return Ok(());
    }
    if let Err(err) = runtime.block_on(run(config)) {
        let _ = writeln!(stderr, "salus-server: {err:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// `salus ARGS`: the old spelling of the `salus` CLI, kept for one
/// release. It prints to the real stderr, not to TensorFlow's log filter.
fn legacy_ctl(args: Vec<std::ffi::OsString>) -> ! {
    salus_server::tf_log::undo_early_redirect();
    std::process::exit(salus_cli::main_legacy_ctl(args));
}

/// `--isolation tenant`: this process becomes `salus-supervisor` (same pid,
/// same arguments), so the process users start maps no TensorFlow. Returns
/// only if it cannot, after saying why.
fn become_supervisor() -> ! {
    // The exec'd binary gets the real stderr, not the pipe of a filter that
    // would no longer run.
    salus_server::tf_log::undo_early_redirect();
    let why = match process::beside_this_binary(SUPERVISOR_BIN) {
        Ok(supervisor) => {
            let mut argv = std::env::args_os();
            let mut command = std::process::Command::new(&supervisor);
            if let Some(arg0) = argv.next() {
                command.arg0(arg0);
            }
            let err = command.args(argv).exec();
            format!("cannot run {}: {err}", supervisor.display())
        }
        Err(why) => why,
    };
    eprintln!("salus-server: --isolation tenant runs the supervisor, and {why} (--isolation none runs without it)");
    std::process::exit(1);
}

/// `--isolation none`: the whole server in this process.
async fn run(config: Config) -> anyhow::Result<()> {
    let server = Server::start(config).await?;
    let listeners = Listeners::bind(server.config()).await?;
    let addr = listeners.announce()?;
    if let Some(metrics) = listeners.metrics {
        let state = server.state().clone();
        if let Some(admin) = AdminService::new(state.node.clone(), state) {
            tokio::spawn(salus_server::frontend::metrics::serve(metrics, admin));
        }
    }
    tracing::info!(%addr, isolation = "none", "serving tensorflow.MasterService, tensorflow.eager.EagerService, tensorflow.WorkerService (GetStatus, RecvTensor) and salus.v1.Admin");
    tracing::warn!("--isolation none: every job runs in this process, so a restart of the server ends every running job (under --isolation tenant, the default, jobs outlive a restart)");
    server.serve(listeners.api, process::shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
