//! `salus-server` binary: flags, logging, signals; everything else is in the library.

use std::io::{IsTerminal, Write};

use anyhow::Context;
use clap::Parser;
use salus_server::config::{Args, Command, Config};
use salus_server::frontend::admin::AdminService;
use salus_server::server::{Role, Server};
use salus_server::supervisor::executors::ExecutorSpec;
use salus_server::tenant::CheckpointRoot;
use tracing_subscriber::EnvFilter;

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
    let mut args = match Args::try_parse() {
        Ok(args) => args,
        Err(err) => {
            let terminal = if err.use_stderr() {
                stderr.is_terminal()
            } else {
                std::io::stdout().is_terminal()
            };
            let styled = err.render();
            let text = if terminal {
                styled.ansi().to_string()
            } else {
                styled.to_string()
            };
            if err.use_stderr() {
                let _ = write!(stderr, "{text}");
            } else {
                print!("{text}");
            }
            std::process::exit(err.exit_code());
        }
    };
    let executor = executor && matches!(args.command, Some(Command::Executor));
    let probe = matches!(args.command, Some(Command::ProbeDevices));
    let ctl = match args.command.take() {
        Some(Command::Ctl(ctl)) => Some(ctl),
        other => {
            // The executor subcommand stays: the config reads it.
            args.command = other;
            None
        }
    };
    if let Some(ctl) = ctl {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        return match runtime.block_on(salus_server::ctl::run(ctl)) {
            Ok(text) => {
                print!("{text}");
                Ok(())
            }
            Err(err) => {
                let _ = writeln!(stderr, "salus-server ctl: {err}");
                std::process::exit(1);
            }
        };
    }
    let config = match Config::try_from(args) {
        Ok(config) => config,
        Err(message) => {
            let _ = writeln!(stderr, "salus-server: {message}");
            std::process::exit(2);
        }
    };
    // TensorFlow reads this when it first logs; set it before any thread starts.
    if config.verbose == 0 && std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
    }
    init_logging(config.verbose, stderr.try_clone()?);
    raise_open_file_limit();
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
        if let Err(err) = runtime.block_on(salus_server::executor::run(config, shutdown_signal())) {
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

fn init_logging(verbose: u8, stderr: std::fs::File) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(LossyWriter(stderr)))
        .with_ansi(false)
        .init();
}

/// The log's writer: a log line that cannot be written is lost, and nothing
/// else happens. An executor's stderr is its supervisor's pipe, broken once the
/// supervisor is gone; on a failed write tracing-subscriber would report it
/// with `eprintln!`, which panics on that same broken stderr and ends the
/// logging thread (the seam reader among them, before it could end the
/// executor).
struct LossyWriter(std::fs::File);

impl Write for LossyWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let listen = config.listen;
    let metrics_listen = config.metrics_listen;
    let role = if config.isolate_tenants {
        Role::Supervisor
    } else {
        Role::Single
    };
    let server = Server::start_as(config, role).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let mut metrics_later = None;
    let metrics = match metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot listen on {at} for metrics"))?,
        ),
        None => None,
    };
    // Tests and scripts wait for this exact line.
    println!("salus-server listening on {addr}");
    let isolate = server.config().isolate_tenants;
    let executors = isolate.then(|| ExecutorSpec {
        exe: std::path::PathBuf::from("/proc/self/exe"),
        checkpoint_base: match &server.config().tenant.checkpoints {
            CheckpointRoot::PerJob(base) => Some(base.clone()),
            CheckpointRoot::Shared(_) => None,
        },
        checkpoint_root: match &server.config().tenant.checkpoints {
            CheckpointRoot::Shared(dir) => Some(dir.clone()),
            CheckpointRoot::PerJob(_) => None,
        },
        args: std::env::args_os().skip(1).collect(),
        memory_limit: server.config().executor_memory,
        idle_timeout: server.config().executor_idle_timeout,
        lane_hold_limit: server.config().lane_hold_limit,
        start_timeout: std::time::Duration::from_secs(120),
        verbose: server.config().verbose > 0,
        log_rate: server.config().executor_log_rate,
    });
    if let Some(metrics) = metrics {
        // A line of its own, after the first one, for tests and scripts too.
        println!("salus-server metrics on {}", metrics.local_addr()?);
        // Under tenant isolation the supervisor's admin API gathers the
        // executors' jobs; the metrics are that API's view.
        let admin = match &executors {
            Some(_) => None,
            None => Some(AdminService::new(server.state().clone())),
        };
        if let Some(admin) = admin {
            tokio::spawn(salus_server::frontend::metrics::serve(metrics, admin));
        } else {
            metrics_later = Some(metrics);
        }
    }
    std::io::stdout().flush()?;
    tracing::info!(%addr, isolation = if isolate { "tenant" } else { "none" }, "serving tensorflow.MasterService, tensorflow.eager.EagerService, tensorflow.WorkerService (GetStatus, RecvTensor) and salus.v1.Admin");
    match executors {
        Some(spec) => {
            salus_server::supervisor::serve(server, listener, spec, metrics_later, shutdown_signal())
                .await?
        }
        None => server.serve(listener, shutdown_signal()).await?,
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::error!(cause = %err, "cannot watch SIGTERM; only Ctrl-C stops the server");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}

/// A server holds a socket per client connection (the supervisor also a copy
/// of each one it handed over): lift the soft limit on open files to the hard
/// one, as servers commonly do, so a default of 1,024 does not cap clients.
/// Executor processes inherit it.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls with a valid out-parameter.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max {
            return;
        }
        let soft = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            tracing::debug!(from = soft, to = limit.rlim_max, "raised the open-file limit");
        }
    }
}
