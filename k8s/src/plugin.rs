//! The DevicePlugin service the kubelet calls: the server's memory as devices
//! of `unit_mib` each, their health from the server, and on Allocate a token
//! whose reservation is the allocated units, handed to the container as
//! SALUS_SERVER and SALUS_TOKEN.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::allocations::{Allocation, Allocations};
use crate::salus_node::{Look, Node, NodeError, MIB};
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
    /// Poked when the server answers again: a pending adoption tries at once.
    server_back: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The units other tenants' reservations take out of the pool: those of
/// tokens the plugin did not issue (their tenant lacks `TENANT_PREFIX`). The
/// plugin's own are left out because the kubelet already counts them, as the
/// devices of its pods; a part of a unit is a whole unit taken.
pub fn units_reserved_elsewhere(reserved_bytes: &HashMap<String, u64>, unit_mib: u64) -> u64 {
    let elsewhere: u64 = reserved_bytes
        .iter()
        .filter(|(tenant, _)| !tenant.starts_with(TENANT_PREFIX))
        .map(|(_, bytes)| *bytes)
        .sum();
    elsewhere.div_ceil(unit_mib.max(1) * MIB)
}

/// The devices standing for `capacity_mib` of memory, `unit_mib` each. All
/// are listed, so their IDs stay the same as reservations come and go; the
/// `withheld` units reserved elsewhere are marked unhealthy, which the kubelet
/// leaves out of the node's allocatable count. Withheld are the highest IDs
/// none of the plugin's allocations holds (preferred allocations start from
/// the lowest); when fewer are free than withheld, the rest are already the
/// kubelet's to count.
pub fn devices(
    capacity_mib: u64,
    unit_mib: u64,
    withheld: u64,
    held: &HashSet<String>,
) -> Vec<Device> {
    let mut devices: Vec<Device> = (0..capacity_mib / unit_mib.max(1))
        .map(|i| Device {
            id: format!("salus-mem-{i}"),
            health: HEALTHY.to_string(),
            topology: None,
        })
        .collect();
    devices
        .iter_mut()
        .rev()
        .filter(|d| !held.contains(&d.id))
        .take(withheld.try_into().unwrap_or(usize::MAX))
        .for_each(|d| d.health = UNHEALTHY.into());
    devices
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
            server_back: Notify::new(),
        })
    }

    /// Looks at the server: publishes the devices (all unhealthy while it
    /// cannot be reached or shares no memory) when they change, and releases
    /// allocations whose pods are gone (see `allocations`).
    pub async fn refresh(&self) -> Result<Look, NodeError> {
        let look = self.node.look().await;
        let now = match &look {
            Ok(look) => {
                let withheld =
                    units_reserved_elsewhere(&look.reserved_bytes, self.settings.unit_mib);
                let held = lock(&self.allocations).devices_held();
                devices(look.capacity_mib, self.settings.unit_mib, withheld, &held)
            }
            Err(_) => {
                // Keep the IDs the kubelet knows, marked unhealthy.
                let mut known = self.devices.borrow().clone();
                known.iter_mut().for_each(|d| d.health = UNHEALTHY.into());
                known
            }
        };
        let healthy = |devices: &[Device]| devices.iter().filter(|d| d.health == HEALTHY).count();
        let mut changed = None;
        self.devices.send_if_modified(|devices| {
            if *devices == now {
                return false;
            }
            changed = Some((healthy(devices), healthy(&now), now.len()));
            *devices = now;
            true
        });
        let look = look?;
        if let Some((before, after, all)) = changed {
            if before != after && after > 0 {
                tracing::info!(
                    free = after,
                    units = all,
                    reserved_elsewhere = all - after,
                    "units advertised as free changed"
                );
            }
        }
        let released = lock(&self.allocations).sweep(&look.jobs, Instant::now());
        for (a, why) in released {
            tracing::info!(
                token = a.token_id,
                tenant = a.tenant,
                "releasing a reservation: {}",
                why.describe()
            );
            self.node.revoke(&a.token_id).await?;
        }
        Ok(look)
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
                    jobs_started: 0,
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
            jobs_started: 0,
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
        match plugin.refresh().await {
            Ok(_) if !reachable => {
                tracing::info!("salus-server is back: devices healthy");
                reachable = true;
                plugin.server_back.notify_one();
            }
            Err(err) if reachable => {
                tracing::warn!("{err}: devices unhealthy until it answers");
                reachable = false;
            }
            _ => {}
        }
    }
}

/// The longest wait between two tries at adopting tokens: the plugin works
/// meanwhile, only an earlier run's tokens are not released yet; and the
/// poll cuts the wait short once the server answers.
pub const ADOPT_RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before try `attempt` (1, 2, ...) after `first`: doubling, at most
/// `ADOPT_RETRY_MAX`.
pub fn adopt_backoff(first: Duration, attempt: u32) -> Duration {
    first
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(ADOPT_RETRY_MAX)
}

/// Adopts an earlier run's tokens (see `adopt`), trying again until the
/// server answers: at `first`, doubling, and at once when the poll finds the
/// server back.
pub async fn adopt_until_done(plugin: Arc<Plugin>, first: Duration) {
    let mut attempt = 0;
    loop {
        match plugin.adopt().await {
            Ok(0) => return,
            Ok(n) => {
                tracing::info!(tokens = n, "adopted the tokens of an earlier run");
                return;
            }
            Err(err) => {
                attempt += 1;
                let wait = adopt_backoff(first, attempt);
                tracing::warn!(
                    attempt,
                    retry_in_s = wait.as_secs_f64(),
                    "cannot adopt the tokens of an earlier run yet: {err}"
                );
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = plugin.server_back.notified() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(devices: &[Device]) -> Vec<&str> {
        devices
            .iter()
            .filter(|d| d.health == HEALTHY)
            .map(|d| d.id.as_str())
            .collect()
    }

    #[test]
    fn reservations_of_other_tenants_take_whole_units_and_the_plugins_own_none() {
        let unit = 256;
        let reserved = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|&(t, b)| (t.to_string(), b)).collect()
        };
        assert_eq!(units_reserved_elsewhere(&reserved(&[]), unit), 0);
        assert_eq!(
            units_reserved_elsewhere(&reserved(&[("slurm-1", 1 << 30)]), unit),
            4
        );
        // 1 byte over 512 MiB takes a third unit; the plugin's tenants count nothing.
        let mixed = reserved(&[("ray", 512 * MIB + 1), ("k8s-ab12", 1 << 30)]);
        assert_eq!(units_reserved_elsewhere(&mixed, unit), 3);
    }

    #[test]
    fn withheld_units_are_the_highest_free_ids_and_ids_stay_put() {
        let none = HashSet::new();
        let all = devices(2048, 256, 0, &none);
        assert_eq!(all.len(), 8);
        assert_eq!(free(&all).len(), 8);
        let some = devices(2048, 256, 3, &none);
        assert_eq!(some.len(), 8);
        assert_eq!(
            free(&some),
            [
                "salus-mem-0",
                "salus-mem-1",
                "salus-mem-2",
                "salus-mem-3",
                "salus-mem-4"
            ]
        );
        // Units the plugin's pods hold are never the ones withheld.
        let held: HashSet<String> = ["salus-mem-7".into(), "salus-mem-5".into()].into();
        let around = devices(2048, 256, 3, &held);
        assert_eq!(
            free(&around),
            [
                "salus-mem-0",
                "salus-mem-1",
                "salus-mem-2",
                "salus-mem-5",
                "salus-mem-7"
            ]
        );
        // More withheld than free: all free ones withheld, the held stay healthy.
        let over = devices(2048, 256, 100, &held);
        assert_eq!(free(&over), ["salus-mem-5", "salus-mem-7"]);
        // The memory short of a unit is no device.
        assert_eq!(devices(2047, 256, 0, &none).len(), 7);
    }

    #[test]
    fn adoption_retries_back_off_to_a_ceiling() {
        let first = Duration::from_millis(500);
        let waits: Vec<f64> = (1..=9)
            .map(|a| adopt_backoff(first, a).as_secs_f64())
            .collect();
        assert_eq!(waits, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]);
        assert_eq!(adopt_backoff(first, u32::MAX), ADOPT_RETRY_MAX);
    }
}
