//! `salus capacity`: the device memory, what tokens reserve, and the lines an engine's config takes.

use salus_proto::salus::v1::ServerInfo;
use serde_json::{json, Value};

pub(super) const MIB: u64 = 1 << 20;

pub(super) fn capacity_json(info: &ServerInfo) -> Value {
    json!({
        "capacity_bytes": info.memory_capacity_bytes,
        "capacity_mib": info.memory_capacity_bytes / MIB,
        "reserved_bytes": info.memory_reserved_bytes,
        "held_back_bytes": info.memory_held_back_bytes,
        "free_bytes": info.memory_free_bytes,
        "unreserved_mib": info.memory_capacity_bytes.saturating_sub(info.memory_reserved_bytes) / MIB,
    })
}

/// The capacity, and the lines an engine's config takes it in.
pub(super) fn capacity_text(info: &ServerInfo) -> String {
    let mib = info.memory_capacity_bytes / MIB;
    format!(
        "capacity   {mib} MiB ({} bytes)\n\
         reserved   {} MiB by tokens ({} MiB of it not used yet)\n\
         free       {} MiB not given to any lane\n\
         slurm      gres.conf: Name=salusmem Count={mib} Flags=CountOnly; slurm.conf node: Gres=salusmem:{mib}\n\
         ray        ray start --resources '{{\"salus_mem_mib\": {mib}}}'\n",
        info.memory_capacity_bytes,
        info.memory_reserved_bytes / MIB,
        info.memory_held_back_bytes / MIB,
        info.memory_free_bytes / MIB,
    )
}
