//! The two gRPC servers a node runs: the edge's (`Fleet`, Envoy's rate limit service,
//! health and reflection) on `api_addr` and its Unix socket, and the peers' (`Peer`,
//! `Admin`) on `raft_addr`; each with its limits, and TLS where configured.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;

use super::{until_stopped, StartError};
use crate::accept::{
    incoming, incoming_unix, CallsLayer, ConnectionLimits, MemberSources, UnixSocket,
};
use crate::api::admin::AdminService;
use crate::api::envoy::EnvoyService;
use crate::api::FleetService;
use crate::limits;
use crate::pb;
use crate::raft::service::PeerService;
use crate::tls::{ApiTls, PeerTls};

/// A server with [`CallsLayer`] around its services.
type Layered = tower::layer::util::Stack<CallsLayer, tower::layer::util::Identity>;

/// A server builder with the limits both servers share, `calls` marking the calls on
/// their connections, and `tls`, if any.
fn server_builder(
    tls: Option<tonic::transport::ServerTlsConfig>,
    streams_per_connection_max: u32,
    calls_per_connection_max: usize,
    calls: CallsLayer,
) -> Result<Server<Layered>, StartError> {
    let builder = Server::builder()
        .max_concurrent_streams(streams_per_connection_max)
        .concurrency_limit_per_connection(calls_per_connection_max)
        .http2_max_header_list_size(limits::HEADER_LIST_BYTES_MAX)
        .timeout(limits::CALL_TIMEOUT_MAX)
        .layer(calls);
    match tls {
        Some(tls) => builder
            .tls_config(tls)
            .map_err(|e| StartError::Tls(crate::tls::TlsError::Config(e.to_string()))),
        None => Ok(builder),
    }
}

/// `raft_addr`: the `Peer` service and `Admin`, behind `[peer_tls]` when configured.
pub(super) fn serve_peers(
    peer: PeerService,
    admin: AdminService,
    tls: Option<&PeerTls>,
    (listener, members): (TcpListener, MemberSources),
    stopped: watch::Receiver<bool>,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, StartError> {
    let before_reading = peer.before_reading();
    let peer = pb::internal::peer_server::PeerServer::new(peer)
        .max_decoding_message_size(limits::PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::PEER_MESSAGE_BYTES_MAX);
    let peer = tonic::service::interceptor::InterceptedService::new(peer, before_reading);
    let admin = pb::internal::admin_server::AdminServer::new(admin)
        .max_decoding_message_size(limits::API_MESSAGE_BYTES_MAX);
    let connections = ConnectionLimits {
        connections_max: limits::PEER_CONNECTIONS_MAX,
        per_source_max: limits::PEER_CONNECTIONS_PER_SOURCE_MAX,
        unproven_max: limits::PEER_UNPROVEN_CONNECTIONS_MAX,
        unproven_per_source_max: limits::PEER_UNPROVEN_PER_SOURCE_MAX,
        first_call_timeout: limits::FIRST_CALL_TIMEOUT,
        idle_timeout: limits::PEER_IDLE_TIMEOUT,
        member_connections_max: limits::PEER_MEMBER_CONNECTIONS_MAX,
    };
    let (incoming, calls) = incoming(listener, connections, members);
    let mut builder = server_builder(
        tls.map(PeerTls::server),
        limits::PEER_STREAMS_PER_CONNECTION_MAX,
        limits::PEER_CALLS_PER_CONNECTION_MAX,
        calls,
    )?;
    let router = builder.add_service(peer).add_service(admin);
    Ok(serve(router, incoming, stopped, "raft"))
}

/// `api_addr`: `Fleet` and health for the edge, TLS only under `[api_tls]`; and the same
/// services on `api_socket`, without TLS, when it is configured.
pub(super) fn serve_api(
    fleet: FleetService,
    envoy: EnvoyService,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    tls: Option<&ApiTls>,
    (listener, socket): (TcpListener, Option<UnixSocket>),
    stopped: watch::Receiver<bool>,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, StartError> {
    // `HitBatch` with a frame's transport limit, every other method with one hit's.
    let fleet = crate::api::batch::FleetRoutes::new(fleet);
    let envoy =
        RateLimitServiceServer::new(envoy).max_decoding_message_size(limits::API_MESSAGE_BYTES_MAX);
    let router = |tls: Option<tonic::transport::ServerTlsConfig>, calls: CallsLayer| {
        Ok::<_, StartError>(
            server_builder(
                tls,
                limits::API_STREAMS_PER_CONNECTION_MAX,
                limits::API_CALLS_PER_CONNECTION_MAX,
                calls,
            )?
            .add_service(health.clone())
            .add_service(fleet.clone())
            .add_service(envoy.clone())
            .add_service(reflection::v1()?)
            .add_service(reflection::v1alpha()?),
        )
    };
    let connections = ConnectionLimits {
        connections_max: limits::API_CONNECTIONS_MAX,
        per_source_max: limits::API_CONNECTIONS_PER_SOURCE_MAX,
        unproven_max: limits::API_UNPROVEN_CONNECTIONS_MAX,
        unproven_per_source_max: limits::API_UNPROVEN_PER_SOURCE_MAX,
        first_call_timeout: limits::FIRST_CALL_TIMEOUT,
        idle_timeout: limits::API_IDLE_TIMEOUT,
        member_connections_max: 0,
    };
    let (incoming_tcp, calls) = incoming(listener, connections, MemberSources::default());
    let tcp = serve(
        router(tls.map(ApiTls::server), calls)?,
        incoming_tcp,
        stopped.clone(),
        "api",
    );
    let unix = match socket {
        Some(UnixSocket { listener, file }) => {
            let served = serve(
                // The connection rides in the connect info: no registry is needed.
                router(None, CallsLayer::default())?,
                incoming_unix(listener, connections),
                stopped,
                "api_socket",
            );
            Some(async move {
                // Removed once the server is done with it.
                let _file = file;
                served.await;
            })
        }
        None => None,
    };
    Ok(async move {
        match unix {
            Some(unix) => drop(tokio::join!(tcp, unix)),
            None => tcp.await,
        }
    })
}

/// gRPC reflection on `api_addr`, so grpcurl and other reflection clients need no proto
/// files: the edge API, Envoy's rate limit service and health, in both versions of the
/// reflection protocol clients use.
mod reflection {
    use super::StartError;
    use crate::pb;

    fn builder() -> tonic_reflection::server::Builder<'static> {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(pb::ENVOY_RLS_DESCRIPTOR_SET)
    }

    fn failed(e: tonic_reflection::server::Error) -> StartError {
        StartError::Reflection(e)
    }

    pub(super) fn v1() -> Result<
        tonic_reflection::pb::v1::server_reflection_server::ServerReflectionServer<
            impl tonic_reflection::pb::v1::server_reflection_server::ServerReflection,
        >,
        StartError,
    > {
        builder().build_v1().map_err(failed)
    }

    pub(super) fn v1alpha() -> Result<
        tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflectionServer<
            impl tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflection,
        >,
        StartError,
    > {
        builder().build_v1alpha().map_err(failed)
    }
}

/// Serves `router` on the connections `incoming` yields, until `stopped`.
async fn serve<IO>(
    router: tonic::transport::server::Router<Layered>,
    incoming: impl futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
    stopped: watch::Receiver<bool>,
    server: &'static str,
) where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    let served = router
        .serve_with_incoming_shutdown(incoming, until_stopped(stopped))
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, server, "server stopped");
    }
}
