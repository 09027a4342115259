//! The `salus-sim` binary end to end: files in, summary and CSVs out, clear errors.

use std::process::Command;

fn sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_salus-sim"))
        .args(args)
        .output()
        .expect("salus-sim runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_writes_jobs_and_prints_json_and_bad_input_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("salus-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let workloads = dir.join("w.csv");
    let trace = dir.join("t.csv");
    let jobs = dir.join("jobs.csv");
    std::fs::write(
        &workloads,
        "model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s\nm,0.5,1,1,1,0\n",
    )
    .unwrap();
    std::fs::write(
        &trace,
        "job_id,model,iterations,submit_time_s,duration_s\na,m,4,0,\nb,m,2,0.5,\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = sim(&[
        "run",
        "--trace",
        trace.to_str().unwrap(),
        "--workloads",
        workloads.to_str().unwrap(),
        "--policy",
        "fifo",
        "--jobs-out",
        jobs.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    // a: 0-2, b: 2-3 (arrived 0.5): mean JCT (2 + 2.5) / 2.
    assert_eq!(summary["makespan_s"], 3.0);
    assert_eq!(summary["mean_jct_s"], 2.25);
    let rows = std::fs::read_to_string(&jobs).unwrap();
    assert!(rows.starts_with("job_id,model,arrival_s,start_s,end_s,jct_s,lane\n"));
    assert!(
        rows.contains("b,m,0.500000,2.000000,3.000000,2.500000,"),
        "{rows}"
    );

    std::fs::write(
        &trace,
        "job_id,model,iterations,submit_time_s\na,nope,1,0\n",
    )
    .unwrap();
    let (ok, _, stderr) = sim(&[
        "run",
        "--trace",
        trace.to_str().unwrap(),
        "--workloads",
        workloads.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("model \"nope\" is not in the workload table"),
        "{stderr}"
    );
    let (ok, _, stderr) = sim(&[
        "run",
        "--trace",
        "/nonexistent",
        "--workloads",
        "/nonexistent",
    ]);
    assert!(
        !ok && stderr.contains("cannot read /nonexistent"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_committed_workload_table_drives_the_inference_experiment() {
    let table = concat!(env!("CARGO_MANIFEST_DIR"), "/../eval/workloads.csv");
    let out = std::env::temp_dir().join(format!("salus-sim-exp-{}", std::process::id()));
    let (ok, stdout, stderr) = sim(&[
        "experiment",
        "inference",
        "--workloads",
        table,
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("14 models x 3 instances"), "{stdout}");
    assert!(stdout.contains("exclusive 42"), "{stdout}");
    assert!(out.join("inference_summary.csv").exists());
    std::fs::remove_dir_all(&out).unwrap();
}
