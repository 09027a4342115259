//! The real server on a free port, for the gRPC integration tests.

use salus_proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use salus_server::config::Config;
use salus_server::server::Server;
use tonic::transport::Channel;

/// A server running on 127.0.0.1 in this test's runtime.
pub struct Running {
    pub channel: Channel,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// The single-process server; its clients (this test process, the server's own user) are the
    /// anonymous tenant (`--auth off`), held to the op deny list and checkpoint confinement.
    pub async fn start(config: Config) -> Running {
        let config = Config {
            auth: salus_server::tenant::identity::AuthMode::Off,
            ..config
        };
        let server = Server::start(config).await.expect("server starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
                .expect("server runs");
        });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Running {
            channel,
            stop: Some(stop),
            task,
        }
    }

    /// Stops the server (gracefully) and waits for it; clients should be dropped first.
    pub async fn stop(mut self) {
        drop(self.channel);
        self.stop.take().unwrap().send(()).unwrap();
        self.task.await.unwrap();
    }
}

/// A float32 vector as the stock client sends it (`tensor_content`).
pub fn float_vector(values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: values.len() as i64,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        tensor_content: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into(),
        ..Default::default()
    }
}

/// The float32 values of a `tensor_content` tensor.
pub fn floats(tensor: &TensorProto) -> Vec<f32> {
    tensor
        .tensor_content
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
