//! `salus info`: what the server runs on: its version and
//! TensorFlow's, its devices as TensorFlow lists them, GPU 0 as the CUDA driver
//! reported it, and where the memory capacity comes from.

use salus_proto::salus::v1::{CudaDevice, ServerInfo};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

pub fn info_json(info: &ServerInfo) -> Value {
    let cuda = info.cuda_gpu0.clone().unwrap_or_default();
    json!({
        "version": info.version,
        "tensorflow_version": info.tensorflow_version,
        "isolation": info.isolation,
        "policy": info.policy,
        "uptime_seconds": info.uptime_seconds,
        "draining": info.draining,
        "draining_since_unix_s": if info.draining { info.draining_since_unix_seconds.into() } else { Value::Null },
        "config_file": if info.config_file.is_empty() { Value::Null } else { info.config_file.clone().into() },
        "devices": info.devices.iter().map(|d| json!({
            "name": d.name,
            "device_type": d.device_type,
            "memory_limit_bytes": d.memory_limit_bytes,
        })).collect::<Vec<_>>(),
        "memory": {
            "capacity_bytes": info.memory_capacity_bytes,
            "source": info.memory_capacity_source,
            "reserved_bytes": info.memory_reserved_bytes,
            "free_bytes": info.memory_free_bytes,
        },
        "executors": info.executors.iter().map(|e| json!({
            "tenant": e.tenant,
            "pid": e.pid,
            "release": e.release,
            "adopted": e.adopted,
            "standing": e.standing,
            "refused_messages": e.refused_messages,
        })).collect::<Vec<_>>(),
        "cuda": {
            "cuda_build": cuda.cuda_build,
            "gpu0_total_bytes": cuda.total_bytes,
            "gpu0_free_bytes": cuda.free_bytes,
            "error": cuda.error,
        },
    })
}

pub fn info_text(info: &ServerInfo) -> String {
    let mut out = format!(
        "salus-server {}, TensorFlow {}, isolation {}, policy {}\n",
        info.version, info.tensorflow_version, info.isolation, info.policy
    );
    if info.draining {
        out += &format!(
            "draining   since unix time {}: new jobs are refused until `salus undrain`\n",
            info.draining_since_unix_seconds
        );
    }
    if !info.config_file.is_empty() {
        out += &format!("config     {}\n", info.config_file);
    }
    for d in &info.devices {
        out += &format!(
            "device     {} ({}, {} MiB as TensorFlow lists it)\n",
            d.name,
            d.device_type,
            d.memory_limit_bytes.max(0) as u64 / MIB
        );
    }
    out += &format!(
        "memory     {}\n",
        capacity_line(info.memory_capacity_bytes, &info.memory_capacity_source)
    );
    out += &format!(
        "cuda       {}\n",
        cuda_line(&info.cuda_gpu0.clone().unwrap_or_default())
    );
    for e in &info.executors {
        out += &format!(
            "executor   {} pid {}, salus-server {}{}, {}{}\n",
            e.tenant,
            e.pid,
            e.release,
            if e.adopted {
                ", adopted from an earlier supervisor"
            } else {
                ""
            },
            e.standing,
            match e.refused_messages {
                0 => String::new(),
                n => format!(", {n} seam messages refused"),
            }
        );
    }
    out
}

fn capacity_line(bytes: u64, source: &str) -> String {
    match source {
        "flag" => format!("{} MiB shared (--memory-capacity)", bytes / MIB),
        "cuda" => format!("{} MiB shared (GPU 0, from the CUDA driver)", bytes / MIB),
        _ => "no capacity: memory admission is off (no --memory-capacity, no GPU)".into(),
    }
}

fn cuda_line(cuda: &CudaDevice) -> String {
    if !cuda.error.is_empty() {
        return format!("GPU 0 not seen: {}", cuda.error);
    }
    format!(
        "GPU 0: {} MiB total, {} MiB free at start (cuMemGetInfo)",
        cuda.total_bytes / MIB,
        cuda.free_bytes / MIB
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use salus_proto::salus::v1::Device;

    fn info(capacity: u64, source: &str, cuda: CudaDevice) -> ServerInfo {
        ServerInfo {
            version: "0.1.0".into(),
            tensorflow_version: "2.21.0".into(),
            isolation: "tenant".into(),
            policy: "fair".into(),
            devices: vec![Device {
                name: "/job:localhost/replica:0/task:0/device:GPU:0".into(),
                device_type: "GPU".into(),
                memory_limit_bytes: 70 << 30,
            }],
            memory_capacity_bytes: capacity,
            memory_capacity_source: source.into(),
            cuda_gpu0: Some(cuda),
            ..Default::default()
        }
    }

    #[test]
    fn a_gpu_seen_by_the_driver_is_shown_with_its_memory() {
        let gpu = CudaDevice {
            cuda_build: true,
            total_bytes: 80 << 30,
            free_bytes: 79 << 30,
            error: String::new(),
        };
        let text = info_text(&info(80 << 30, "cuda", gpu));
        assert!(text.contains("device:GPU:0 (GPU, 71680 MiB"), "{text}");
        assert!(
            text.contains("81920 MiB shared (GPU 0, from the CUDA driver)"),
            "{text}"
        );
        assert!(
            text.contains("GPU 0: 81920 MiB total, 80896 MiB free at start"),
            "{text}"
        );
        let value = info_json(&info(80 << 30, "cuda", CudaDevice::default()));
        assert_eq!(value["memory"]["source"], "cuda");
        assert_eq!(value["devices"][0]["device_type"], "GPU");
    }

    #[test]
    fn no_gpu_says_why() {
        let none = CudaDevice {
            cuda_build: false,
            error: "this salus-server was built without the cuda feature".into(),
            ..Default::default()
        };
        let text = info_text(&info(0, "none", none));
        assert!(text.contains("memory admission is off"), "{text}");
        assert!(
            text.contains("GPU 0 not seen: this salus-server was built without"),
            "{text}"
        );
    }
}
