//! A cap on the connections one client owner holds open at once
//! (`--max-tenant-connections`).
//!
//! Every open connection costs the server a file descriptor (the supervisor
//! keeps a copy of each one it hands to an executor), and the descriptors are
//! shared by all tenants: one user opening connections until the limit is
//! reached would leave every other tenant unable to connect. So each
//! connection is counted against its owner when it is accepted, before it
//! says anything: a loopback client's Unix user, else the client's address
//! (a token is only read later, from the first request). A connection beyond
//! the cap is told why (HTTP/2 GOAWAY) and closed; the count goes down when
//! the server lets a connection go ([`ConnectionPermit`] dropped).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::tenant::identity::PeerUser;

/// Whom a connection is counted against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A loopback client's Unix user.
    Uid(u32),
    /// Any other client, by its address.
    Address(IpAddr),
}

impl Owner {
    /// The owner of a connection from `remote` whose Unix user, when the
    /// server looked it up, is `user`; `lookup` finds a loopback peer's user
    /// when the `--auth` mode did not ask for it.
    pub fn of(
        user: &PeerUser,
        remote: Option<SocketAddr>,
        lookup: impl FnOnce() -> Option<u32>,
    ) -> Owner {
        if let PeerUser::Uid(uid) = user {
            return Owner::Uid(*uid);
        }
        match remote {
            Some(addr) if is_loopback(addr.ip()) => match lookup() {
                Some(uid) => Owner::Uid(uid),
                None => Owner::Address(addr.ip()),
            },
            Some(addr) => Owner::Address(addr.ip()),
            None => Owner::Address(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        }
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Uid(uid) => write!(f, "Unix user {uid}"),
            Owner::Address(ip) => write!(f, "client address {ip}"),
        }
    }
}

/// Open connections per owner, against one cap.
#[derive(Debug)]
pub struct ConnectionCounts {
    /// 0: no cap (connections are still counted).
    cap: usize,
    open: Mutex<HashMap<Owner, usize>>,
}

/// A connection over its owner's cap.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub owner: Owner,
    pub cap: usize,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "salus-server: connection refused: {} already has {} connections open to this server, \
             the most one user or client address may hold (--max-tenant-connections); close some \
             (each TensorFlow client process holds one or two) or ask the operator to raise it",
            self.owner, self.cap
        )
    }
}

impl ConnectionCounts {
    pub fn new(cap: usize) -> Arc<ConnectionCounts> {
        Arc::new(ConnectionCounts {
            cap,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection of `owner`, unless it already holds the cap.
    pub fn admit(self: &Arc<Self>, owner: Owner) -> Result<ConnectionPermit, Refused> {
        let mut open = self.lock();
        let count = open.entry(owner.clone()).or_insert(0);
        if self.cap != 0 && *count >= self.cap {
            return Err(Refused {
                owner,
                cap: self.cap,
            });
        }
        *count += 1;
        Ok(ConnectionPermit {
            counts: self.clone(),
            owner,
        })
    }

    /// How many connections `owner` holds open.
    pub fn open(&self, owner: &Owner) -> usize {
        self.lock().get(owner).copied().unwrap_or(0)
    }

    fn release(&self, owner: &Owner) {
        let mut open = self.lock();
        if let Some(count) = open.get_mut(owner) {
            *count -= 1;
            if *count == 0 {
                open.remove(owner);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, usize>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One counted connection; dropping it gives the place back.
#[derive(Debug)]
pub struct ConnectionPermit {
    counts: Arc<ConnectionCounts>,
    owner: Owner,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.counts.release(&self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_holds_at_most_the_cap_and_gets_places_back() {
        let counts = ConnectionCounts::new(2);
        let alice = Owner::Uid(1000);
        let first = counts.admit(alice.clone()).unwrap();
        let _second = counts.admit(alice.clone()).unwrap();
        let refused = counts.admit(alice.clone()).unwrap_err();
        assert_eq!(refused.cap, 2);
        assert!(refused
            .to_string()
            .contains("Unix user 1000 already has 2 connections"));
        assert!(refused.to_string().contains("--max-tenant-connections"));
        // Another owner is not affected.
        let _bob = counts.admit(Owner::Uid(1001)).unwrap();
        drop(first);
        assert_eq!(counts.open(&alice), 1);
        let _third = counts.admit(alice.clone()).unwrap();
        assert_eq!(counts.open(&alice), 2);
    }

    #[test]
    fn no_cap_counts_but_admits_all() {
        let counts = ConnectionCounts::new(0);
        let owner = Owner::Address("10.0.0.7".parse().unwrap());
        let permits: Vec<_> = (0..100)
            .map(|_| counts.admit(owner.clone()).unwrap())
            .collect();
        assert_eq!(counts.open(&owner), 100);
        drop(permits);
        assert_eq!(counts.open(&owner), 0);
        assert!(
            counts.lock().is_empty(),
            "an owner with nothing open is forgotten"
        );
    }

    #[test]
    fn owners_are_users_on_loopback_and_addresses_elsewhere() {
        let loopback: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
        let remote: SocketAddr = "192.0.2.5:4000".parse().unwrap();
        let unknown = PeerUser::Unknown("not looked up".into());
        assert_eq!(
            Owner::of(&PeerUser::Uid(7), Some(loopback), || None),
            Owner::Uid(7)
        );
        assert_eq!(
            Owner::of(&unknown, Some(loopback), || Some(9)),
            Owner::Uid(9)
        );
        assert_eq!(Owner::of(&unknown, Some(mapped), || Some(9)), Owner::Uid(9));
        assert_eq!(
            Owner::of(&unknown, Some(loopback), || None),
            Owner::Address(loopback.ip())
        );
        assert_eq!(
            Owner::of(&unknown, Some(remote), || panic!(
                "no lookup for a remote client"
            )),
            Owner::Address(remote.ip())
        );
    }
}
