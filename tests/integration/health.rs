//! grpc.health.v1 and server reflection, as grpcurl uses them.

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::{v1, v1alpha};

use crate::support::*;

const SERVICES: [&str; 4] = [
    "aaa.v1.RunService",
    "aaa.v1.ApprovalService",
    "aaa.v1.WorkerService",
    "grpc.health.v1.Health",
];

#[tokio::test(flavor = "multi_thread")]
async fn health_check_says_serving() {
    let server = TestServer::start().await;
    let mut health = HealthClient::new(server.channel().await);
    let response = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Health/Check")
        .into_inner();
    assert_eq!(response.status, ServingStatus::Serving as i32);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reflection_v1_lists_and_describes_the_services() {
    use v1::server_reflection_client::ServerReflectionClient;
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    use v1::ServerReflectionRequest;

    let server = TestServer::start().await;
    let mut reflection = ServerReflectionClient::new(server.channel().await);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("aaa.v1.RunService".into()),
    ]
    .map(|message| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    });
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("ServerReflectionInfo")
        .into_inner();

    let listed = responses
        .message()
        .await
        .expect("reflection")
        .expect("a response");
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("expected the service list, got {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in SERVICES {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
    let described = responses
        .message()
        .await
        .expect("reflection")
        .expect("a response");
    let Some(MessageResponse::FileDescriptorResponse(files)) = described.message_response else {
        panic!("expected a file descriptor, got {described:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reflection_v1alpha_lists_the_services() {
    use v1alpha::server_reflection_client::ServerReflectionClient;
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    use v1alpha::ServerReflectionRequest;

    let server = TestServer::start().await;
    let mut reflection = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("ServerReflectionInfo")
        .into_inner();
    let listed = responses
        .message()
        .await
        .expect("reflection")
        .expect("a response");
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("expected the service list, got {listed:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in SERVICES {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
    server.shutdown().await;
}
