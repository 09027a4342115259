//! What both binaries (`salus-server`, `salus-supervisor`) do as processes:
//! flags parsed or their error shown, logging, the shutdown signals, the
//! open-file limit, and where the other binary is.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use tracing_subscriber::EnvFilter;

use crate::config::{Args, Config};

/// The binary that runs TensorFlow: `--isolation none`, executors, probes.
pub const SERVER_BIN: &str = "salus-server";
/// The binary `salus-server` becomes under `--isolation tenant`: it links no
/// TensorFlow.
pub const SUPERVISOR_BIN: &str = "salus-supervisor";

/// `name`, installed beside this process's binary (both binaries are built
/// and installed together).
pub fn beside_this_binary(name: &str) -> Result<PathBuf, String> {
    let this =
        std::env::current_exe().map_err(|e| format!("cannot find this process's binary: {e}"))?;
    let other = this.with_file_name(name);
    if other.is_file() {
        Ok(other)
    } else {
        Err(format!(
            "{} is not beside {} ({} is missing): install both binaries of the salus-server package together",
            name,
            this.display(),
            other.display()
        ))
    }
}

/// The flags, or their error (or `--help`) shown on `stderr` / stdout, styled
/// where that is a terminal, and the process ended with clap's exit code.
pub fn parse_args_or_exit(stderr: &mut std::fs::File) -> Args {
    match Args::try_parse_with_config_file() {
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
    }
}

/// The validated config of `args`, or its error shown and the process ended
/// with exit code 2.
pub fn config_or_exit(args: Args, stderr: &mut std::fs::File) -> Config {
    match Config::try_from(args) {
        Ok(config) => config,
        Err(message) => {
            let _ = writeln!(stderr, "salus-server: {message}");
            std::process::exit(2);
        }
    }
}

/// What a serving process sets up before its async runtime: TensorFlow's
/// log level (read when it first logs; inherited by executors; set before
/// any thread starts), the log into `stderr`, the open-file limit.
pub fn set_up_serving(config: &Config, stderr: std::fs::File) {
    if config.verbose == 0 && std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
    }
    init_logging(config.verbose, config.log_json, stderr);
    for note in &config.deprecations {
        tracing::warn!("{note}");
    }
    raise_open_file_limit();
}

/// A serving process's sockets: the API's, and `--metrics-listen`'s.
pub struct Listeners {
    pub api: tokio::net::TcpListener,
    pub metrics: Option<tokio::net::TcpListener>,
    /// The API's socket came from systemd (socket activation), which keeps it
    /// across a restart.
    pub activated: bool,
}

impl Listeners {
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        Self::open(config, crate::listen_fds::Activated::default(), None).await
    }

    /// The sockets this process was given (`passed`: systemd's socket
    /// activation, or an in-place upgrade: `listen_fds::take`), else those a keeper holds for the
    /// rendezvous `keeper` (the previous supervisor's, across a restart),
    /// else new ones.
    pub async fn open(
        config: &Config,
        passed: crate::listen_fds::Activated,
        keeper: Option<&std::path::Path>,
    ) -> anyhow::Result<Listeners> {
        use anyhow::Context;
        let activated = passed.api.is_some() && !passed.upgraded;
        let (mut api, mut metrics) = (passed.api, passed.metrics);
        if let Some(api) = &api {
            if !crate::listen_fds::serves(api, config.listen) {
                tracing::info!(passed = ?api.local_addr().ok(), listen = %config.listen, "serving the socket passed in, not --listen");
            }
        } else if let Some((held, held_metrics)) =
            keeper.and_then(crate::listen_fds::take_from_keeper)
        {
            if crate::listen_fds::serves(&held, config.listen) {
                tracing::info!(at = ?held.local_addr().ok(), "took the listening socket the previous supervisor left");
                api = Some(held);
                metrics = held_metrics.filter(|m| {
                    config
                        .metrics_listen
                        .is_some_and(|at| crate::listen_fds::serves(m, at))
                });
            }
        }
        let served = |held: std::net::TcpListener| -> std::io::Result<tokio::net::TcpListener> {
            held.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(held)
        };
        let api = match api {
            Some(held) => served(held)?,
            None => {
                let listen = config.listen;
                tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?
            }
        };
        let metrics = match (metrics, config.metrics_listen) {
            (Some(held), _) => Some(served(held)?),
            (None, Some(at)) => Some(
                tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("cannot listen on {at} for metrics"))?,
            ),
            (None, None) => None,
        };
        Ok(Listeners {
            api,
            metrics,
            activated,
        })
    }

    /// Prints where the server listens, a line each, and returns the API's
    /// address. Tests and scripts wait for these exact lines.
    pub fn announce(&self) -> std::io::Result<std::net::SocketAddr> {
        let addr = self.api.local_addr()?;
        println!("salus-server listening on {addr}");
        if let Some(metrics) = &self.metrics {
            println!("salus-server metrics on {}", metrics.local_addr()?);
        }
        std::io::stdout().flush()?;
        Ok(addr)
    }
}

/// The descriptor the log writes to (-1 before `init_logging`).
static LOG_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// From now on the log and fd 2 go to `to` (an adopted executor's new
/// supervisor reads its log there).
pub fn redirect_log(to: &std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let log = LOG_FD.load(std::sync::atomic::Ordering::SeqCst);
    for fd in [2, log] {
        // SAFETY: dup2 onto descriptors this process owns (the log's stays open).
        if fd >= 0 && unsafe { libc::dup2(to.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The log: `-v` levels, `RUST_LOG` over them, into `stderr`; text lines, or
/// JSON objects one per line (`json`).
pub fn init_logging(verbose: u8, json: bool, stderr: std::fs::File) {
    {
        use std::os::fd::AsRawFd;
        LOG_FD.store(stderr.as_raw_fd(), std::sync::atomic::Ordering::SeqCst);
    }
    crate::log_json::set_enabled(json);
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(LossyWriter(stderr)))
        .with_ansi(false);
    if json {
        log.json().flatten_event(true).init();
    } else {
        log.init();
    }
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

/// The rendezvous folder of the state directory `state_dir` (made, mode 0700:
/// only the server's user may reach its executors' sockets).
pub fn rendezvous_dir(state_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    use std::os::unix::fs::DirBuilderExt;
    let dir = state_dir.join(crate::seam::adoption::DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot make {}", dir.display()))?;
    Ok(dir)
}

/// How the supervisor is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Everything stops: the executors finish their requests and end.
    Full,
    /// Only the supervisor: its executors and their jobs wait for the next one
    /// (`--adopt-grace`).
    Restart,
    /// As `Restart`, and the supervisor execs its binary anew (which may have
    /// been replaced), with its listening sockets (SIGUSR2).
    Upgrade,
}

/// The supervisor's stop: SIGINT (Ctrl-C) stops everything; SIGTERM (what
/// systemd, container runtimes and `kill` send, for a stop as for a restart)
/// stops only the supervisor when `restartable` (its executors can be
/// adopted), else everything; SIGUSR2, when `restartable`, upgrades in place.
pub async fn stop_signal(restartable: bool) -> Stop {
    // SIGUSR2 is watched only where it upgrades: elsewhere it keeps its default.
    let upgrade = async {
        if !restartable {
            return std::future::pending::<()>().await;
        }
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()) {
            Ok(mut usr2) => {
                usr2.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::error!(cause = %err, "cannot watch SIGTERM; only Ctrl-C stops the server");
            let _ = ctrl_c.await;
            return Stop::Full;
        }
    };
    tokio::select! {
        _ = ctrl_c => {
            tracing::info!("SIGINT received");
            Stop::Full
        }
        () = upgrade => {
            tracing::info!("SIGUSR2 received: the supervisor execs its binary anew; executors and their jobs wait for it");
            Stop::Upgrade
        }
        _ = term.recv() => {
            if restartable {
                tracing::info!("SIGTERM received: the supervisor stops; executors and their jobs wait for the next one");
                Stop::Restart
            } else {
                tracing::info!("SIGTERM received");
                Stop::Full
            }
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (a process whose stop is always the
/// full one: `--isolation none`, an executor).
pub async fn shutdown_signal() {
    stop_signal(false).await;
}

/// A server holds a socket per client connection (the supervisor also a copy
/// of each one it handed over): lift the soft limit on open files to the hard
/// one, as servers commonly do, so a default of 1,024 does not cap clients.
/// Executor processes inherit it.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls with a valid out-parameter.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let soft = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            tracing::debug!(
                from = soft,
                to = limit.rlim_max,
                "raised the open-file limit"
            );
        }
    }
}
