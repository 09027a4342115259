//! A plain training program on the `tensorflow` crate (TensorFlow's C API underneath), as
//! any Rust user would write it: imports a GraphDef, runs its init op, runs the train op
//! STEPS times and prints each step's loss (as integration_tests/c_programs/train.c does).
//!
//!   salus-tf-rust-train GRAPH.pb INIT_OP TRAIN_OP LOSS_OP STEPS
//!
//! With HOLD_SESSION=1 it prints "holding" after training and keeps the session open until
//! stdin closes. test_c_api_shim.py runs it with and without libsalus_tf.so preloaded.

use std::error::Error;
use std::io::Read;

use tensorflow::{Graph, ImportGraphDefOptions, Session, SessionOptions, SessionRunArgs, Tensor};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        eprintln!("usage: {} GRAPH.pb INIT_OP TRAIN_OP LOSS_OP STEPS", args[0]);
        std::process::exit(64);
    }
    let graph_def = std::fs::read(&args[1])?;
    let steps: usize = args[5].parse()?;
    let mut graph = Graph::new();
    graph.import_graph_def(&graph_def, &ImportGraphDefOptions::new())?;
    let mut session = Session::new(&SessionOptions::new(), &graph)?;

    let mut init = SessionRunArgs::new();
    init.add_target(&graph.operation_by_name_required(&args[2])?);
    session.run(&mut init)?;

    let train = graph.operation_by_name_required(&args[3])?;
    let loss = graph.operation_by_name_required(&args[4])?;
    for step in 0..steps {
        let mut run = SessionRunArgs::new();
        run.add_target(&train);
        let fetch = run.request_fetch(&loss, 0);
        session.run(&mut run)?;
        let value: Tensor<f32> = run.fetch(fetch)?;
        // {:?} of an f32 round-trips exactly: equal lines mean bit-identical losses.
        println!("step {step} loss {:?}", value[0]);
    }
    if std::env::var("HOLD_SESSION").as_deref() == Ok("1") {
        println!("holding");
        let mut rest = Vec::new();
        std::io::stdin().read_to_end(&mut rest)?;
    }
    session.close()?;
    Ok(())
}
