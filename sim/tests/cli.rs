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

#[test]
fn run_shares_between_users_with_weights_and_reports_them() {
    let dir = std::env::temp_dir().join(format!("salus-sim-users-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let workloads = dir.join("w.csv");
    let trace = dir.join("t.csv");
    std::fs::write(
        &workloads,
        "model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s\nm,1,1,1,1,0\n",
    )
    .unwrap();
    // alice: one job of 10 iterations; bob: three of 10.
    std::fs::write(
        &trace,
        "job_id,model,iterations,submit_time_s,user\na,m,10,0,alice\nb1,m,10,0,bob\nb2,m,10,0,bob\nb3,m,10,0,bob\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--trace",
            trace.to_str().unwrap(),
            "--workloads",
            workloads.to_str().unwrap(),
            "--policy",
            "fair",
            "--interference",
            "0",
        ];
        args.extend_from_slice(extra);
        sim(&args)
    };
    // alice's share of the device while both had work, from the JSON.
    let alice_share = |extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = run(&args);
        assert!(ok, "{stderr}");
        let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(out["users"][0]["user"], "alice");
        assert_eq!(out["users"][1]["jobs"], 3);
        let first = &out["intervals"][0];
        assert_eq!(first["users"], serde_json::json!(["alice", "bob"]));
        let device: Vec<f64> = first["device_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        device[0] / (device[0] + device[1])
    };
    let by_tenant = alice_share(&[]);
    assert!((by_tenant - 0.5).abs() < 0.06, "{by_tenant}");
    let explicit = alice_share(&["--share", "tenants"]);
    assert_eq!(by_tenant, explicit, "tenants is the default");
    let by_job = alice_share(&["--share", "jobs"]);
    assert!((by_job - 0.25).abs() < 0.06, "{by_job}");
    let weighted = alice_share(&["--weight", "alice=3"]);
    assert!((weighted - 0.75).abs() < 0.06, "{weighted}");
    // The text summary lists the users.
    let (ok, stdout, stderr) = run(&[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("user alice") && stdout.contains("user bob"),
        "{stdout}"
    );
    assert!(stdout.contains("max/min"), "{stdout}");
    // Clear errors.
    let (ok, _, stderr) = run(&["--share", "people"]);
    assert!(!ok && stderr.contains("unknown share mode"), "{stderr}");
    let (ok, _, stderr) = run(&["--weight", "carol=2"]);
    assert!(
        !ok && stderr.contains("\"carol\"") && stderr.contains("users: alice, bob"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&["--weight", "alice"]);
    assert!(!ok && stderr.contains("USER=WEIGHT"), "{stderr}");
    let (ok, _, stderr) = run(&["--weight", "alice=0"]);
    assert!(!ok && stderr.contains("1 to 1000"), "{stderr}");
    std::fs::write(
        &trace,
        "job_id,model,iterations,submit_time_s,user\na,m,1,0,alice\nb,m,1,0,bob smith\n",
    )
    .unwrap();
    let (ok, _, stderr) = run(&[]);
    assert!(
        !ok && stderr.contains("line 3") && stderr.contains("\"bob smith\""),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_users_experiment_prints_both_shares_and_writes_its_csvs() {
    let table = concat!(env!("CARGO_MANIFEST_DIR"), "/../eval/workloads.csv");
    let out = std::env::temp_dir().join(format!("salus-sim-users-exp-{}", std::process::id()));
    let (ok, stdout, stderr) = sim(&[
        "experiment",
        "users",
        "--workloads",
        table,
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(d) users"), "{stdout}");
    assert!(stdout.contains("share=tenants crowd 50.0%"), "{stdout}");
    assert!(stdout.contains("share=jobs crowd 88.9%"), "{stdout}");
    for file in [
        "users_trace.csv",
        "users_intervals.csv",
        "users_jobs_tenants.csv",
        "users_jobs_jobs.csv",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    // The trace it wrote reads back with its users.
    let (ok, _, stderr) = sim(&[
        "run",
        "--trace",
        out.join("users_trace.csv").to_str().unwrap(),
        "--workloads",
        table,
        "--policy",
        "fair",
    ]);
    assert!(ok, "{stderr}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn recurring_traces_and_history_files_run_under_learned() {
    let dir = std::env::temp_dir().join(format!("salus-sim-cli-learned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let workloads = dir.join("w.csv");
    let trace = dir.join("t.csv");
    let history = dir.join("history.txt");
    std::fs::write(
        &workloads,
        "model,iteration_s,persistent_mb,ephemeral_mb,utilization,startup_s\nm,0.5,1,1,1,0\n",
    )
    .unwrap();
    let (ok, _, stderr) = sim(&[
        "gen-trace",
        "--workloads",
        workloads.to_str().unwrap(),
        "--jobs",
        "30",
        "--recurring",
        "--out",
        trace.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.starts_with("job_id,model,iterations,submit_time_s,duration_s,name"),
        "{text}"
    );
    std::fs::write(
        &history,
        "salus-history\t1\nrun\t\tscript0\tm\t30\t60\tcompleted\n",
    )
    .unwrap();
    let args = |history: &str| {
        vec![
            "run".to_string(),
            "--trace".into(),
            trace.to_str().unwrap().into(),
            "--workloads".into(),
            workloads.to_str().unwrap().into(),
            "--policy".into(),
            "learned".into(),
            "--no-length-hints".into(),
            "--history".into(),
            history.into(),
        ]
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sim(&args)
    };
    let (ok, stdout, stderr) = run(args(history.to_str().unwrap()));
    assert!(ok && stdout.starts_with("learned"), "{stdout}{stderr}");
    std::fs::write(&history, "salus-history\t1\nrun\tx\n").unwrap();
    let (ok, _, stderr) = run(args(history.to_str().unwrap()));
    assert!(!ok && stderr.contains("line 2"), "{stderr}");
}
