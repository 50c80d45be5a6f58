//! The server assembly, written once for every role: the guarded listener's server (TLS,
//! connection activity, authentication), server reflection (v1 and v1alpha) advertising
//! exactly the public services of the port, `grpc.health.v1.Health` (open to probes without
//! credentials: the server and each public service report SERVING), the role's services, the optional metrics endpoint, and serving
//! until shutdown.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

use crate::ServiceError;
use crate::cluster_secret::Check;
use crate::listen::{GuardedLayers, Listener};
use crate::metrics::MetricsSource;

/// The routes of a guarded server: add a role's services to it.
pub type Routes = tonic::transport::server::Router<GuardedLayers>;

/// The reflection builder over the `dissem.v1` files, advertising exactly `services` (the
/// public ones a port serves; internal services are never advertised).
fn reflection_builder(services: &[&str]) -> tonic_reflection::server::Builder<'static> {
    let mut b = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET);
    for s in services {
        b = b.with_service_name(s.to_string());
    }
    b
}

/// gRPC server reflection, v1, advertising exactly `services`.
pub fn reflection(
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    ServiceError,
> {
    reflection_builder(services)
        .build_v1()
        .map_err(|e| ServiceError::Startup(e.to_string()))
}

/// The same reflection in its v1alpha dialect, which Python's grpcio-reflection, Postman and
/// older grpcurl speak.
pub fn reflection_v1alpha(
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
    ServiceError,
> {
    reflection_builder(services)
        .build_v1alpha()
        .map_err(|e| ServiceError::Startup(e.to_string()))
}

/// An internal service (`Cluster`, `Daemon`): only callers with the cluster secret reach it.
pub fn internal<S>(service: S, check: Check) -> InterceptedService<S, Check> {
    InterceptedService::new(service, check)
}

/// Serves `public` (advertised by reflection) plus whatever `routes` adds on `listener`, and
/// the metrics endpoint when given, until `shutdown` resolves and the calls and streams open
/// then have ended, or the listener's shutdown grace has passed (then it returns anyway:
/// before, a subscriber's open stream kept a stopped node serving until the subscriber
/// left, minutes, while Kubernetes kills a pod after its grace period).
pub async fn serve(
    listener: Listener,
    public: &[&str],
    metrics: Option<(TcpListener, MetricsSource)>,
    routes: impl FnOnce(Routes) -> Routes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServiceError> {
    if let Some((l, source)) = metrics {
        tokio::spawn(crate::metrics::serve(l, source));
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    for s in public {
        health
            .set_service_status(*s, tonic_health::ServingStatus::Serving)
            .await;
    }
    let router = listener
        .server()?
        .add_service(reflection(public)?)
        .add_service(reflection_v1alpha(public)?)
        .add_service(health_service);
    let grace = listener.shutdown_grace();
    let (stopped_tx, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = stopped_tx.send(());
    };
    let serving = routes(router).serve_with_incoming_shutdown(listener.incoming(), shutdown);
    tokio::pin!(serving);
    let overdue = async move {
        if stopped.await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = &mut serving => r.map_err(|e| ServiceError::Startup(e.to_string())),
        () = overdue => {
            tracing::warn!(
                "calls or streams still open {grace:?} after the stop: stopping anyway"
            );
            Ok(())
        }
    }
}
