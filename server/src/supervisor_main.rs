//! `salus-supervisor`: the process users start under `--isolation tenant`
//! (`salus-server` execs into it). It links no TensorFlow: its code reaches
//! no TensorFlow symbol, so the linker leaves the libraries out. Devices are
//! listed and jobs run by `salus-server` children (`probe-devices`,
//! `executor`) beside it.

use std::io::Write;
use std::os::fd::AsFd;

use salus_server::config::Config;
use salus_server::node_start::{NodeStart, Role};
use salus_server::process::{self, Listeners, SERVER_BIN};
use salus_server::runtime::device_list;
use salus_server::supervisor::executors::ExecutorSpec;
use salus_server::tenant::CheckpointRoot;

fn main() -> anyhow::Result<()> {
    salus_server::tf_env::prepare();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Err(err) = runtime.block_on(run(config, server_bin)) {
        let _ = writeln!(stderr, "salus-server: {err:#}");
        std::process::exit(1);
    }
    Ok(())
}

async fn run(config: Config, server_bin: std::path::PathBuf) -> anyhow::Result<()> {
    let probe_bin = server_bin.clone();
    let start = NodeStart::begin(config, &Role::Supervisor, move |_| {
        device_list::list_in_child(probe_bin)
    })
    .await?;
    let listeners = Listeners::bind(&start.config).await?;
    let addr = listeners.announce()?;
    let config = &start.config;
    let spec = ExecutorSpec {
        exe: server_bin,
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
        start_timeout: std::time::Duration::from_secs(120),
        verbose: config.verbose > 0,
        log_rate: config.executor_log_rate,
    };
    tracing::info!(%addr, isolation = "tenant", "serving tensorflow.MasterService, tensorflow.eager.EagerService, tensorflow.WorkerService (GetStatus, RecvTensor) and salus.v1.Admin");
    salus_server::supervisor::serve(
        start,
        listeners.api,
        spec,
        listeners.metrics,
        process::shutdown_signal(),
    )
    .await?;
    tracing::info!("stopped");
    Ok(())
}
