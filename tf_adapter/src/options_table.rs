//! What the program put into each TF_SessionOptions (the struct is opaque to the shim):
//! whether it chose a target, and the config bytes it set. Filled by the interposed
//! TF_NewSessionOptions / TF_SetTarget / TF_SetConfig, dropped by TF_DeleteSessionOptions.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptionsEntry {
    /// The program called TF_SetTarget with a non-empty target: its sessions are left alone.
    pub target_set: bool,
    /// The last ConfigProto TensorFlow accepted from the program (empty: the default config).
    pub config: Vec<u8>,
}

/// Keyed by the options' address.
#[derive(Default)]
pub struct OptionsTable {
    entries: Mutex<HashMap<usize, OptionsEntry>>,
}

impl OptionsTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, OptionsEntry>> {
        // A panic while holding the lock leaves a consistent map (each update is one insert).
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn created(&self, key: usize) {
        self.lock().insert(key, OptionsEntry::default());
    }

    pub fn set_target(&self, key: usize, target: &[u8]) {
        self.lock().entry(key).or_default().target_set = !target.is_empty();
    }

    pub fn set_config(&self, key: usize, config: &[u8]) {
        self.lock().entry(key).or_default().config = config.to_vec();
    }

    pub fn deleted(&self, key: usize) {
        self.lock().remove(&key);
    }

    /// Options the shim never saw (made before it was loaded) count as default ones.
    pub fn get(&self, key: usize) -> OptionsEntry {
        self.lock().get(&key).cloned().unwrap_or_default()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_target_and_config_until_deleted() {
        let table = OptionsTable::default();
        table.created(1);
        assert_eq!(table.get(1), OptionsEntry::default());
        table.set_config(1, &[0x10, 0x02]);
        table.set_target(1, b"grpc://h:1");
        assert_eq!(
            table.get(1),
            OptionsEntry {
                target_set: true,
                config: vec![0x10, 0x02]
            }
        );
        table.set_target(1, b""); // "" is TensorFlow's "in-process"
        assert!(!table.get(1).target_set);
        table.deleted(1);
        assert_eq!(table.len(), 0);
        // A reused address starts afresh.
        table.created(1);
        assert_eq!(table.get(1), OptionsEntry::default());
        assert_eq!(table.get(99), OptionsEntry::default());
    }
}
