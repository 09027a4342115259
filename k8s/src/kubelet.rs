//! The kubelet side: serve the plugin on its socket in the kubelet's
//! device-plugin directory, register it on kubelet.sock, and start over when
//! the kubelet restarts (it recreates kubelet.sock and removes the plugins'
//! sockets, forgetting every registration).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Endpoint, Server, Uri};

use crate::authority;
use crate::plugin::Plugin;
use crate::v1beta1::device_plugin_server::DevicePluginServer;
use crate::v1beta1::registration_client::RegistrationClient;
use crate::v1beta1::{DevicePluginOptions, RegisterRequest};

pub const KUBELET_SOCKET: &str = "kubelet.sock";
pub const API_VERSION: &str = "v1beta1";

pub struct Registration {
    pub dir: PathBuf,
    pub socket_name: String,
    pub resource: String,
}

/// Identity of a socket file: a recreated one has another change time (its
/// inode number may well be reused), or is gone.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

async fn register(reg: &Registration) -> Result<(), String> {
    let kubelet = reg.dir.join(KUBELET_SOCKET);
    let channel = Endpoint::try_from("http://[::1]:1")
        .map_err(|e| e.to_string())?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let kubelet = kubelet.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(kubelet).await?)) }
        }))
        .await
        .map_err(|e| format!("cannot connect to the kubelet: {e}"))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: reg.socket_name.clone(),
            resource_name: reg.resource.clone(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|s| format!("the kubelet refused the registration: {}", s.message()))?;
    Ok(())
}

/// The listener's connections, each relayed through `authority::relay` (so
/// that any `:authority` is taken) to the end of a socket pair the server
/// gets. Ends when the server stops taking connections.
fn relayed(listener: UnixListener) -> ReceiverStream<std::io::Result<UnixStream>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let connection = accepted.and_then(|(client, _)| {
                let (server_end, relay_end) = UnixStream::pair()?;
                tokio::spawn(authority::relay(client, relay_end));
                Ok(server_end)
            });
            if tx.send(connection).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Serves and registers the plugin for as long as the process lives.
pub async fn run(plugin: Arc<Plugin>, reg: Registration) -> std::io::Result<()> {
    let ours = reg.dir.join(&reg.socket_name);
    let kubelet = reg.dir.join(KUBELET_SOCKET);
    loop {
        // A stale socket of an earlier run would make bind fail.
        let _ = std::fs::remove_file(&ours);
        let listener = UnixListener::bind(&ours)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            Server::builder()
                .add_service(DevicePluginServer::new(plugin.clone()))
                .serve_with_incoming_shutdown(relayed(listener), async {
                    let _ = stop_rx.await;
                }),
        );
        // Register once the kubelet is there; again until it accepts.
        let kubelet_id = loop {
            match identity(&kubelet) {
                Some(id) => match register(&reg).await {
                    Ok(()) => {
                        tracing::info!(resource = reg.resource, socket = %ours.display(), "registered with the kubelet");
                        break id;
                    }
                    Err(err) => tracing::warn!("{err}; retrying"),
                },
                None => tracing::debug!("waiting for {}", kubelet.display()),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        // Watch for a kubelet restart: kubelet.sock recreated, or our socket removed.
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if identity(&kubelet) != Some(kubelet_id) || identity(&ours).is_none() {
                tracing::info!("the kubelet restarted: serving and registering again");
                break;
            }
        }
        let _ = stop_tx.send(());
        let _ = server.await;
    }
}
