//! Limits per tenant: its weight in sharing device time, how many jobs it may
//! have open, and the highest priority it may claim. Set in the tenants file
//! (`LIMIT=VALUE` fields after a tenant's three) and changed at run time by an
//! admin (`salus limits`); a `*` line sets the defaults.

use std::collections::BTreeMap;
use std::fmt;

use crate::sched::tenants::MAX_WEIGHT;
use crate::sched::units::parse_size;

/// The names a tenants file line and `salus limits` accept.
pub const LIMIT_NAMES: &str = "weight=1..1000, max-jobs=N, max-priority=P, memory=SIZE";

/// One tenant's limits; None: the default's (or none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Its share of device time against other tenants' (1 to 1000).
    pub weight: Option<u32>,
    /// Jobs (graph sessions and eager contexts) it may have open at once.
    pub max_jobs: Option<u32>,
    /// The highest priority hint it may claim; higher ones are lowered to it.
    pub max_priority: Option<i32>,
    /// Device memory its jobs may hold admitted or waiting at once, bytes
    /// (with `--memory-capacity`): a job that would go beyond is refused.
    pub memory: Option<u64>,
}

impl Limits {
    /// Applies one `NAME=VALUE` field.
    pub fn set_field(&mut self, field: &str) -> Result<(), String> {
        let (name, value) = field
            .split_once('=')
            .ok_or_else(|| format!("expected LIMIT=VALUE ({LIMIT_NAMES}), found {field:?}"))?;
        let bad = |what: &str| format!("{name}={value:?}: {what}");
        match name {
            "weight" => {
                let weight: u32 = value.parse().map_err(|_| bad("not a whole number"))?;
                if !(1..=MAX_WEIGHT).contains(&weight) {
                    return Err(bad(&format!("a weight is 1 to {MAX_WEIGHT}")));
                }
                self.weight = Some(weight);
            }
            "max-jobs" => {
                self.max_jobs = Some(value.parse().map_err(|_| bad("not a whole number"))?);
            }
            "max-priority" => {
                self.max_priority = Some(value.parse().map_err(|_| bad("not a whole number"))?);
            }
            "memory" => {
                self.memory = Some(parse_size(value).map_err(|e| bad(&e))?);
            }
            _ => return Err(format!("unknown limit {name:?}: known are {LIMIT_NAMES}")),
        }
        Ok(())
    }

    /// Parses `NAME=VALUE` fields.
    pub fn parse<'a>(fields: impl IntoIterator<Item = &'a str>) -> Result<Limits, String> {
        let mut limits = Limits::default();
        for field in fields {
            limits.set_field(field)?;
        }
        Ok(limits)
    }

    /// These limits, each unset one taken from `default`.
    pub fn over(&self, default: &Limits) -> Limits {
        Limits {
            weight: self.weight.or(default.weight),
            max_jobs: self.max_jobs.or(default.max_jobs),
            max_priority: self.max_priority.or(default.max_priority),
            memory: self.memory.or(default.memory),
        }
    }

    /// `other`'s set limits replace these.
    pub fn update(&mut self, other: &Limits) {
        *self = other.over(self);
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(w) = self.weight {
            parts.push(format!("weight={w}"));
        }
        if let Some(n) = self.max_jobs {
            parts.push(format!("max-jobs={n}"));
        }
        if let Some(p) = self.max_priority {
            parts.push(format!("max-priority={p}"));
        }
        if let Some(m) = self.memory {
            parts.push(format!("memory={m}"));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// Every tenant's limits by name, and the defaults (`*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitsTable {
    default: Limits,
    by_name: BTreeMap<String, Limits>,
    /// What valid issued tokens give a tenant, over its own limits.
    granted: BTreeMap<String, Limits>,
}

impl LimitsTable {
    /// `name` is a tenant's name (a user name, a tenants file name,
    /// `anonymous`) or `*` for the defaults; set fields replace, others stay.
    pub fn set(&mut self, name: &str, limits: &Limits) {
        if name == "*" {
            self.default.update(limits);
        } else {
            self.by_name
                .entry(name.to_string())
                .or_default()
                .update(limits);
        }
    }

    /// The limits issued tokens give tenant `name` (None: no valid token has any).
    pub fn set_granted(&mut self, name: &str, granted: Option<Limits>) {
        match granted {
            Some(limits) => self.granted.insert(name.to_string(), limits),
            None => self.granted.remove(name),
        };
    }

    /// The limits that apply to the tenant named `name` whose Unix user (if
    /// it has one) is `user`: its tokens', then its own by its name (or its
    /// user's name), then the defaults. Takes the names the tenant keeps
    /// (`Tenant::name`, `Tenant::user`): no lookup here.
    pub fn for_tenant(&self, name: &str, user: Option<&str>) -> Limits {
        let find = |table: &BTreeMap<String, Limits>| {
            table.get(name).or_else(|| table.get(user?)).cloned()
        };
        let own = find(&self.by_name).unwrap_or_default().over(&self.default);
        find(&self.granted).map_or(own.clone(), |granted| granted.over(&own))
    }

    /// The limits that apply to a tenant of this name (`*`: the defaults).
    pub fn named(&self, name: &str) -> Limits {
        if name == "*" {
            return self.default.clone();
        }
        let own = self
            .by_name
            .get(name)
            .cloned()
            .unwrap_or_default()
            .over(&self.default);
        self.granted
            .get(name)
            .map_or(own.clone(), |granted| granted.over(&own))
    }

    /// This table's own limits with the grants of issued tokens taken from
    /// `other` (a tenants file read again keeps what tokens grant).
    pub fn with_grants_of(mut self, other: &LimitsTable) -> LimitsTable {
        self.granted = other.granted.clone();
        self
    }

    /// The limits set for `name` itself (`*`: the defaults), without the
    /// defaults or grants over them.
    pub fn own(&self, name: &str) -> Limits {
        if name == "*" {
            return self.default.clone();
        }
        self.by_name.get(name).cloned().unwrap_or_default()
    }

    pub fn defaults(&self) -> &Limits {
        &self.default
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty() && self.default == Limits::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::identity::Tenant;

    fn named(name: &str) -> Tenant {
        Tenant::named(name)
    }

    impl LimitsTable {
        fn of(&self, tenant: &Tenant) -> Limits {
            self.for_tenant(&tenant.name, tenant.user.as_deref())
        }
    }

    #[test]
    fn fields_parse_and_errors_name_the_limit() {
        let limits = Limits::parse(["weight=3", "max-jobs=4", "max-priority=-1"]).unwrap();
        assert_eq!(
            limits,
            Limits {
                weight: Some(3),
                max_jobs: Some(4),
                max_priority: Some(-1),
                memory: None,
            }
        );
        assert_eq!(
            Limits::parse(["memory=2GiB"]).unwrap().memory,
            Some(2 << 30)
        );
        assert!(Limits::parse(["memory=lots"])
            .unwrap_err()
            .contains("memory=\"lots\""));
        assert_eq!(limits.to_string(), "weight=3 max-jobs=4 max-priority=-1");
        assert!(Limits::parse(["weight=0"])
            .unwrap_err()
            .contains("1 to 1000"));
        assert!(Limits::parse(["weight=x"])
            .unwrap_err()
            .contains("weight=\"x\""));
        assert!(Limits::parse(["cpu=1"])
            .unwrap_err()
            .contains("unknown limit \"cpu\""));
        assert!(Limits::parse(["max-jobs"])
            .unwrap_err()
            .contains("LIMIT=VALUE"));
    }

    #[test]
    fn a_tenants_own_limits_over_the_defaults() {
        let mut table = LimitsTable::default();
        assert!(table.is_empty());
        table.set(
            "*",
            &Limits::parse(["max-jobs=8", "max-priority=2"]).unwrap(),
        );
        table.set("alice", &Limits::parse(["max-jobs=2", "weight=5"]).unwrap());
        assert_eq!(
            table.of(&named("alice")),
            Limits {
                weight: Some(5),
                max_jobs: Some(2),
                max_priority: Some(2),
                memory: None,
            }
        );
        assert_eq!(table.of(&named("bob")), table.defaults().clone());
        // A later change replaces only the limits it sets.
        table.set("alice", &Limits::parse(["weight=1"]).unwrap());
        assert_eq!(table.of(&named("alice")).max_jobs, Some(2));
        assert_eq!(table.of(&named("alice")).weight, Some(1));
        // A uid tenant is found by its user's name.
        table.set("root", &Limits::parse(["max-priority=9"]).unwrap());
        assert_eq!(table.of(&Tenant::from_uid(0)).max_priority, Some(9));
        // A token's limits go over the tenant's own while it is valid.
        table.set_granted("alice", Some(Limits::parse(["max-priority=7"]).unwrap()));
        assert_eq!(table.of(&named("alice")).max_priority, Some(7));
        assert_eq!(table.named("alice").max_jobs, Some(2));
        table.set_granted("alice", None);
        assert_eq!(table.of(&named("alice")).max_priority, Some(2));
    }
}
