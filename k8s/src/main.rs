//! `salus-device-plugin`: a Kubernetes device plugin for a node's salus-server.
//! It advertises the server's shareable device memory as the extended resource
//! `salus.io/gpu-mem`, in units of `--unit-mib`, healthy while the server
//! answers, less the units other tenants' tokens reserve (Slurm, Ray, an
//! admin); on Allocate it asks the server for a token whose reservation is the
//! allocated units and gives the container SALUS_SERVER and SALUS_TOKEN. See
//! deploy/k8s/README.md.

mod allocations;
mod authority;
mod kubelet;
mod plugin;
mod salus_node;

pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Kubernetes device plugin: a node's salus-server memory as salus.io/gpu-mem"
)]
struct Args {
    /// The node's salus-server (its admin API; the plugin must be an admin:
    /// root or the server's user on loopback).
    #[arg(long, env = "SALUS_SERVER", default_value = "127.0.0.1:5501")]
    server: String,
    /// The address containers reach the server at (default: --server; with
    /// hostNetwork pods, loopback works).
    #[arg(long)]
    advertise: Option<String>,
    /// The extended resource advertised.
    #[arg(long, default_value = "salus.io/gpu-mem")]
    resource: String,
    /// MiB of device memory per advertised unit.
    #[arg(long, default_value_t = 256)]
    unit_mib: u64,
    /// The kubelet's device-plugin directory (kubelet.sock is there).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    plugin_dir: PathBuf,
    /// The plugin's socket name in that directory.
    #[arg(long, default_value = "salus-gpu-mem.sock")]
    socket_name: String,
    /// Seconds after which an allocation none of whose jobs reached the server
    /// is released (its token revoked): the pod never ran, or never connected.
    #[arg(long, default_value_t = 600)]
    unused_timeout: u64,
    /// Seconds after its last job ended that an allocation is released (its
    /// token revoked). A job shorter than --poll counts too: the server counts
    /// the jobs each reservation's tenant started.
    #[arg(long, default_value_t = 300)]
    release_after: u64,
    /// Lifetime of the tokens handed out, in seconds (0: until released).
    #[arg(long, default_value_t = 0)]
    token_expires: u64,
    /// Seconds between polls of the server: health, capacity, memory reserved
    /// by tokens the plugin did not issue (those units are advertised
    /// unhealthy, so the kubelet does not count them allocatable), jobs. Also
    /// the first wait before adopting an earlier run's tokens is retried while
    /// the server does not answer (then doubling, at most 60 s).
    #[arg(long, default_value_t = 5.0)]
    poll: f64,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.unit_mib == 0 {
        eprintln!("salus-device-plugin: --unit-mib must be at least 1");
        std::process::exit(2);
    }
    if !(args.poll.is_finite() && args.poll > 0.0) {
        eprintln!("salus-device-plugin: --poll must be a positive number of seconds");
        std::process::exit(2);
    }
    let node = salus_node::Node {
        address: args.server.clone(),
    };
    let plugin = plugin::Plugin::new(
        node,
        plugin::Settings {
            advertise: args
                .advertise
                .clone()
                .unwrap_or_else(|| args.server.clone()),
            unit_mib: args.unit_mib,
            token_expires: args.token_expires,
        },
        allocations::Allocations::new(
            Duration::from_secs(args.unused_timeout),
            Duration::from_secs(args.release_after),
        ),
    );
    let poll_every = Duration::from_secs_f64(args.poll);
    match plugin.refresh().await {
        Ok(look) => tracing::info!(
            server = args.server,
            capacity_mib = look.capacity_mib,
            units = look.capacity_mib / args.unit_mib,
            "salus-server found"
        ),
        Err(err) => tracing::warn!("{err}: advertising no devices until it answers"),
    }
    // The server may come up after the plugin (both started at boot).
    tokio::spawn(plugin::adopt_until_done(plugin.clone(), poll_every));
    tokio::spawn(plugin::poll(plugin.clone(), poll_every));
    let registration = kubelet::Registration {
        dir: args.plugin_dir,
        socket_name: args.socket_name,
        resource: args.resource,
    };
    let serve = kubelet::run(plugin, registration);
    tokio::select! {
        result = serve => {
            if let Err(err) = result {
                eprintln!("salus-device-plugin: {err}");
                std::process::exit(1);
            }
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm() => {}
    }
    tracing::info!("stopping (tokens handed out stay valid; a restarted plugin adopts them)");
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
