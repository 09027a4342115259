//! The workspace's crates say the architecture (issue 56): each crate depends
//! only on the crates below it, and the crates that must run without
//! TensorFlow (the supervisor, the `salus` CLI, the scheduler, ...) have no
//! path to it at all: `cargo tree -p salus-supervisor` names no tensorflow.
//! The supervisor's maps are checked at run time too
//! (integration_tests/test_tenant_isolation.py); this test makes the rule
//! hold before anything runs, from `cargo metadata` (offline: the lock file's
//! graph, no network).

mod workspace;

use std::collections::{BTreeMap, BTreeSet};

/// Each workspace crate and the workspace crates it may depend on (normal and
/// build dependencies; tests may use any). A new crate must be placed here.
const MAY_DEPEND_ON: &[(&str, &[&str])] = &[
    ("salus-proto", &[]),
    ("salus-sched", &[]),
    ("salus-cli", &["salus-proto", "salus-sched"]),
    ("salus-node", &["salus-proto", "salus-sched"]),
    ("salus-supervisor", &["salus-node"]),
    (
        "salus-server",
        &["salus-proto", "salus-sched", "salus-cli", "salus-node"],
    ),
    ("salus-sim", &["salus-sched"]),
    ("salus-k8s", &["salus-proto"]),
    ("salus-tf-adapter", &[]),
    ("salus-tf-rust-client", &[]),
    ("salus-fuzz", &["salus-proto", "salus-server"]),
];

/// The crates that must build and run on a machine without TensorFlow.
const TENSORFLOW_FREE: &[&str] = &[
    "salus-proto",
    "salus-sched",
    "salus-cli",
    "salus-node",
    "salus-supervisor",
    "salus-sim",
    "salus-k8s",
];

/// Package names that stand for TensorFlow (its C library's bindings and the
/// `tensorflow` crate over them).
fn is_tensorflow(name: &str) -> bool {
    name.starts_with("tensorflow")
}

/// The resolved graph: package id -> (name, ids of its normal and build dependencies).
struct Graph {
    names: BTreeMap<String, String>,
    deps: BTreeMap<String, Vec<String>>,
    members: Vec<String>,
}

fn metadata() -> Graph {
    let value = workspace::cargo_metadata(&[]);
    let names = value["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let deps = value["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    // kind null: a normal dependency; "build": a build script's. Dev ones are left out.
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].as_str() != Some("dev"))
                })
                .map(|d| d["pkg"].as_str().unwrap().to_string())
                .collect();
            (node["id"].as_str().unwrap().to_string(), deps)
        })
        .collect();
    let members = value["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    Graph {
        names,
        deps,
        members,
    }
}

impl Graph {
    fn id_of(&self, name: &str) -> &str {
        self.members
            .iter()
            .find(|id| self.names[*id] == name)
            .unwrap_or_else(|| panic!("{name} is not a workspace member"))
    }

    /// A path from `from` to a package `is_target` accepts, as names, if there is one.
    fn path_to(&self, from: &str, is_target: impl Fn(&str) -> bool) -> Option<Vec<String>> {
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from]);
        let mut seen = BTreeSet::from([from]);
        while let Some(id) = queue.pop_front() {
            if is_target(&self.names[id]) {
                let mut path = vec![self.names[id].clone()];
                let mut at = id;
                while let Some(prev) = came_from.get(at) {
                    path.push(self.names[*prev].clone());
                    at = prev;
                }
                path.reverse();
                return Some(path);
            }
            for next in self.deps.get(id).into_iter().flatten() {
                if seen.insert(next) {
                    came_from.insert(next, id);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

#[test]
fn tensorflow_free_crates_have_no_path_to_tensorflow() {
    let graph = metadata();
    // The test would pass vacuously if TensorFlow were no longer found at all.
    assert!(
        graph
            .path_to(graph.id_of("salus-server"), is_tensorflow)
            .is_some(),
        "salus-server reaches no tensorflow package: is_tensorflow no longer names it"
    );
    for name in TENSORFLOW_FREE {
        if let Some(path) = graph.path_to(graph.id_of(name), is_tensorflow) {
            panic!(
                "{name} must not reach TensorFlow, but: {}",
                path.join(" -> ")
            );
        }
    }
}

#[test]
fn crates_depend_only_on_the_crates_below_them() {
    let graph = metadata();
    let rules: BTreeMap<&str, &[&str]> = MAY_DEPEND_ON.iter().copied().collect();
    let member_names: BTreeSet<&str> = graph
        .members
        .iter()
        .map(|id| graph.names[id].as_str())
        .collect();
    for name in &member_names {
        let Some(allowed) = rules.get(name) else {
            panic!("workspace crate {name} has no place in MAY_DEPEND_ON: add it (and what it may depend on)");
        };
        let id = graph.id_of(name);
        for dep in graph.deps.get(id).into_iter().flatten() {
            let dep_name = graph.names[dep].as_str();
            if member_names.contains(dep_name) {
                assert!(
                    allowed.contains(&dep_name),
                    "{name} depends on {dep_name}, which it may not (MAY_DEPEND_ON allows {allowed:?})"
                );
            }
        }
    }
    for name in rules.keys() {
        assert!(
            member_names.contains(name),
            "MAY_DEPEND_ON names {name}, not a workspace crate"
        );
    }
}
