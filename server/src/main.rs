//! `salus-server` binary: flags, logging, signals; everything else is in the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use salus_server::config::{Args, Config};
use salus_server::server::Server;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = Config::try_from(args).map_err(anyhow::Error::msg)?;
    // TensorFlow reads this when it first logs; set it before any thread starts.
    if config.verbose == 0 && std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
    }
    // Before TensorFlow logs anything: route its stderr lines through the filter.
    let stderr = salus_server::tf_log::filter_stderr(config.verbose > 0)
        .context("cannot set up log filtering")?;
    init_logging(config.verbose, stderr);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(config))
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
        .with_writer(std::sync::Mutex::new(stderr))
        .with_ansi(false)
        .init();
}

async fn run(config: Config) -> anyhow::Result<()> {
    let listen = config.listen;
    let server = Server::start(config).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    // Tests and scripts wait for this exact line.
    println!("salus-server listening on {addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, "serving tensorflow.MasterService and salus.v1.Admin");
    server.serve(listener, shutdown_signal()).await?;
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
