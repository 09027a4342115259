//! Sharing between tenants: under [`Share::Tenants`] a lane's device time is
//! divided among the tenants (people) with work, by weight, and the policy
//! orders only one tenant's jobs among themselves. A user who starts eight jobs
//! then gets one share, as a user with one job does.
//!
//! Each tenant has a virtual time: its device time divided by its weight. The
//! lane runs the tenant with the least virtual time that has something to run
//! (start-time fair queueing between tenants). A tenant that joins, or comes
//! back after an idle spell longer than [`IDLE_CREDIT`], starts at the least
//! virtual time of the tenants that are busy, so it shares from then on instead
//! of monopolising the device until it has caught up with time it did not ask for.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::Nanos;

/// Who a job belongs to, as the driver numbers its tenants. Jobs added
/// without one belong to [`TenantId::NONE`], which is one tenant like any other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u64);

impl TenantId {
    pub const NONE: TenantId = TenantId(0);
}

/// Between whom the device is shared first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Share {
    /// Equal device time (by weight) between tenants with work; the policy
    /// orders each tenant's own jobs.
    #[default]
    Tenants,
    /// The policy orders every job of a lane, whoever owns it.
    Jobs,
}

impl Share {
    pub fn name(self) -> &'static str {
        match self {
            Share::Tenants => "tenants",
            Share::Jobs => "jobs",
        }
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown share mode {0:?}: expected tenants or jobs")]
pub struct UnknownShare(pub String);

impl FromStr for Share {
    type Err = UnknownShare;
    fn from_str(name: &str) -> Result<Share, UnknownShare> {
        match name {
            "tenants" => Ok(Share::Tenants),
            "jobs" => Ok(Share::Jobs),
            other => Err(UnknownShare(other.to_string())),
        }
    }
}

/// Weights run from 1 to this; a tenant's share is proportional to its weight.
pub const MAX_WEIGHT: u32 = 1000;
pub const DEFAULT_WEIGHT: u32 = 1;

/// How long a tenant may go without work and keep the credit it has (device
/// time it is behind the others): long enough for a client's work between
/// steps or a short evaluation, short enough that a tenant that stopped for
/// a while does not then hold the device until the others' past is matched.
pub const IDLE_CREDIT: Nanos = 1_000_000_000;

/// A read-only summary of a tenant, for status APIs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantStatus {
    pub id: TenantId,
    pub weight: u32,
    /// Device time of all its jobs so far, closed ones included.
    pub service: Nanos,
    /// Live jobs.
    pub jobs: usize,
    /// Iterations queued or running.
    pub work: usize,
}

#[derive(Clone, Debug)]
struct TenantState {
    weight: u32,
    service: Nanos,
    /// Device time over weight, in units of 1/MAX_WEIGHT ns; raised to the
    /// busy tenants' least when the tenant (re)starts.
    vtime: u128,
    jobs: usize,
    work: usize,
    last_active: Nanos,
}

impl TenantState {
    fn new(weight: u32, now: Nanos) -> TenantState {
        TenantState {
            weight,
            service: 0,
            vtime: 0,
            jobs: 0,
            work: 0,
            last_active: now,
        }
    }

    fn busy(&self, now: Nanos) -> bool {
        self.jobs > 0 && (self.work > 0 || now <= self.last_active.saturating_add(IDLE_CREDIT))
    }
}

/// Every tenant the core has seen: kept after their jobs leave, so that
/// device time per tenant is a running total and weights persist.
#[derive(Default)]
pub(crate) struct Tenants {
    states: HashMap<TenantId, TenantState>,
    weights: HashMap<TenantId, u32>,
}

impl Tenants {
    fn state(&mut self, id: TenantId, now: Nanos) -> &mut TenantState {
        let weight = self.weights.get(&id).copied().unwrap_or(DEFAULT_WEIGHT);
        self.states
            .entry(id)
            .or_insert_with(|| TenantState::new(weight, now))
    }

    /// Raises `id`'s virtual time to the least of the other busy tenants'.
    pub fn catch_up(&mut self, id: TenantId, now: Nanos) {
        let floor = self
            .states
            .iter()
            .filter(|(other, state)| **other != id && state.busy(now))
            .map(|(_, state)| state.vtime)
            .min();
        if let Some(floor) = floor {
            let state = self.state(id, now);
            state.vtime = state.vtime.max(floor);
        }
    }

    pub fn set_weight(&mut self, id: TenantId, weight: u32) {
        self.weights.insert(id, weight);
        if let Some(state) = self.states.get_mut(&id) {
            state.weight = weight;
        }
    }

    pub fn joined(&mut self, id: TenantId, now: Nanos) {
        if self.state(id, now).jobs == 0 {
            self.catch_up(id, now);
        }
        let state = self.state(id, now);
        state.jobs += 1;
        state.last_active = now;
    }

    /// A job left with `work` iterations queued or running.
    pub fn left(&mut self, id: TenantId, work: usize) {
        if let Some(state) = self.states.get_mut(&id) {
            state.jobs = state.jobs.saturating_sub(1);
            state.work = state.work.saturating_sub(work);
        }
    }

    pub fn submitted(&mut self, id: TenantId, now: Nanos) {
        let state = self.state(id, now);
        if state.work == 0 && now > state.last_active.saturating_add(IDLE_CREDIT) {
            self.catch_up(id, now);
        }
        let state = self.state(id, now);
        state.work += 1;
        state.last_active = now;
    }

    /// Queued iterations dropped without running.
    pub fn dropped(&mut self, id: TenantId, count: usize) {
        if let Some(state) = self.states.get_mut(&id) {
            state.work = state.work.saturating_sub(count);
        }
    }

    /// An iteration ended (`device_time` None: it never ran).
    pub fn finished(&mut self, id: TenantId, device_time: Option<Nanos>, now: Nanos) {
        if let Some(state) = self.states.get_mut(&id) {
            state.work = state.work.saturating_sub(1);
            state.last_active = now;
        }
        if let Some(t) = device_time {
            self.charge(id, t);
        }
    }

    pub fn charge(&mut self, id: TenantId, device_time: Nanos) {
        if let Some(state) = self.states.get_mut(&id) {
            state.service = state.service.saturating_add(device_time);
            state.vtime += device_time as u128 * MAX_WEIGHT as u128 / state.weight.max(1) as u128;
        }
    }

    /// The rank between tenants: less virtual time first.
    pub fn vtime(&self, id: TenantId) -> u128 {
        self.states.get(&id).map_or(0, |state| state.vtime)
    }

    pub fn status(&self) -> Vec<TenantStatus> {
        let mut all: Vec<TenantStatus> = self
            .states
            .iter()
            .map(|(&id, state)| TenantStatus {
                id,
                weight: state.weight,
                service: state.service,
                jobs: state.jobs,
                work: state.work,
            })
            .collect();
        all.sort_by_key(|t| t.id);
        all
    }
}
