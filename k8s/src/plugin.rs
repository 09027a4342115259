//! The DevicePlugin service the kubelet calls: the server's memory as devices
//! of `unit_mib` each, their health from the server, and on Allocate a token
//! whose reservation is the allocated units, handed to the container as
//! SALUS_SERVER and SALUS_TOKEN.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::allocations::{Allocation, Allocations};
use crate::salus_node::{Node, NodeError};
use crate::v1beta1::device_plugin_server::DevicePlugin;
use crate::v1beta1::*;

pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// Every allocation's token tenant starts so: a restarted plugin adopts them.
pub const TENANT_PREFIX: &str = "k8s-";

pub struct Settings {
    /// Where containers reach the server (SALUS_SERVER).
    pub advertise: String,
    pub unit_mib: u64,
    /// Token lifetime in seconds (0: until released).
    pub token_expires: u64,
}

pub struct Plugin {
    pub node: Node,
    pub settings: Settings,
    pub allocations: Mutex<Allocations>,
    devices: watch::Sender<Vec<Device>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The devices standing for `capacity_mib` of memory, `unit_mib` each.
pub fn devices(capacity_mib: u64, unit_mib: u64, health: &str) -> Vec<Device> {
    (0..capacity_mib / unit_mib.max(1))
        .map(|i| Device {
            id: format!("salus-mem-{i}"),
            health: health.to_string(),
            topology: None,
        })
        .collect()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most the remaining length into `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No randomness: fall back to the clock (a tenant name, not a secret).
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            return format!("{nanos:x}");
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Plugin {
    pub fn new(node: Node, settings: Settings, allocations: Allocations) -> Arc<Plugin> {
        Arc::new(Plugin {
            node,
            settings,
            allocations: Mutex::new(allocations),
            devices: watch::channel(Vec::new()).0,
        })
    }

    /// Asks the server for its capacity; publishes the devices (all unhealthy
    /// while it cannot be reached or shares no memory) when they change.
    pub async fn refresh_devices(&self) -> Result<u64, NodeError> {
        let capacity = self.node.capacity_mib().await;
        let now = match &capacity {
            Ok(mib) => devices(*mib, self.settings.unit_mib, HEALTHY),
            Err(_) => {
                // Keep the IDs the kubelet knows, marked unhealthy.
                let mut known = self.devices.borrow().clone();
                known.iter_mut().for_each(|d| d.health = UNHEALTHY.into());
                known
            }
        };
        self.devices.send_if_modified(|devices| {
            if *devices == now {
                return false;
            }
            *devices = now;
            true
        });
        capacity
    }

    /// Releases allocations whose pods are gone (see `allocations`).
    pub async fn sweep(&self) -> Result<(), NodeError> {
        let with_jobs = self.node.tenants_with_jobs().await?;
        let released = lock(&self.allocations).sweep(&with_jobs, Instant::now());
        for (a, why) in released {
            tracing::info!(
                token = a.token_id,
                tenant = a.tenant,
                "releasing a reservation: {}",
                why.describe()
            );
            self.node.revoke(&a.token_id).await?;
        }
        Ok(())
    }

    /// Takes over the tokens an earlier run of the plugin issued.
    pub async fn adopt(&self) -> Result<usize, NodeError> {
        let tokens = self.node.tokens_with_prefix(TENANT_PREFIX).await?;
        let mut all = lock(&self.allocations);
        let mut adopted = 0;
        for (id, tenant) in tokens {
            if !all.knows_token(&id) {
                all.add(Allocation {
                    token_id: id,
                    tenant,
                    devices: Vec::new(),
                    issued: Instant::now(),
                    last_job: None,
                });
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    async fn allocate_one(
        &self,
        request: &ContainerAllocateRequest,
    ) -> Result<ContainerAllocateResponse, Status> {
        let ids = &request.devices_ids;
        let known: Vec<String> = self.devices.borrow().iter().map(|d| d.id.clone()).collect();
        if ids.is_empty() {
            return Err(Status::invalid_argument("no devices to allocate"));
        }
        if let Some(unknown) = ids.iter().find(|id| !known.contains(id)) {
            return Err(Status::invalid_argument(format!(
                "unknown device {unknown:?}: this plugin advertises salus-mem-0..{}",
                known.len().saturating_sub(1)
            )));
        }
        // The kubelet hands out devices again only after their pod is gone.
        let stale = lock(&self.allocations).take_overlapping(ids);
        for old in stale {
            tracing::info!(
                token = old.token_id,
                tenant = old.tenant,
                "releasing a reservation: its devices were allocated again"
            );
            self.node.revoke(&old.token_id).await.map_err(node_status)?;
        }
        let mib = ids.len() as u64 * self.settings.unit_mib;
        let tenant = format!("{TENANT_PREFIX}{}", random_hex(6));
        let issued = self
            .node
            .issue(&tenant, mib, self.settings.token_expires)
            .await
            .map_err(node_status)?;
        tracing::info!(
            token = issued.id,
            tenant,
            mib,
            devices = ids.len(),
            "allocated"
        );
        lock(&self.allocations).add(Allocation {
            token_id: issued.id.clone(),
            tenant: tenant.clone(),
            devices: ids.clone(),
            issued: Instant::now(),
            last_job: None,
        });
        Ok(ContainerAllocateResponse {
            envs: HashMap::from([
                ("SALUS_SERVER".to_string(), self.settings.advertise.clone()),
                ("SALUS_TOKEN".to_string(), issued.token),
                ("SALUS_RESERVED_MIB".to_string(), mib.to_string()),
            ]),
            annotations: HashMap::from([
                ("salus.io/token-id".to_string(), issued.id),
                ("salus.io/tenant".to_string(), tenant),
            ]),
            ..Default::default()
        })
    }
}

fn node_status(err: NodeError) -> Status {
    match err {
        NodeError::Refused(_, status) => Status::new(status.code(), err_text(&status)),
        NodeError::Unreachable(..) => Status::unavailable(err.to_string()),
        NodeError::NoCapacity(_) => Status::failed_precondition(err.to_string()),
    }
}

fn err_text(status: &Status) -> String {
    format!("salus-server refused: {}", status.message())
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Arc<Plugin> {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<DeviceStream>, Status> {
        // The current list at once, then each change, until the kubelet hangs up.
        let mut watched = self.devices.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let devices = watched.borrow_and_update().clone();
                if tx.send(Ok(ListAndWatchResponse { devices })).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = watched.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // Units are interchangeable: the ones it must have, then the first available.
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = r.allocation_size.max(0) as usize;
                let mut ids = r.must_include_device_i_ds.clone();
                for id in r.available_device_i_ds {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in &request.get_ref().container_requests {
            container_responses.push(self.allocate_one(container).await?);
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Polls the server: device health and count, and releases allocations.
pub async fn poll(plugin: Arc<Plugin>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut reachable = true;
    loop {
        tick.tick().await;
        let result = match plugin.refresh_devices().await {
            Ok(_) => plugin.sweep().await,
            Err(err) => Err(err),
        };
        match result {
            Ok(()) if !reachable => {
                tracing::info!("salus-server is back: devices healthy");
                reachable = true;
            }
            Err(err) if reachable => {
                tracing::warn!("{err}: devices unhealthy until it answers");
                reachable = false;
            }
            _ => {}
        }
    }
}
