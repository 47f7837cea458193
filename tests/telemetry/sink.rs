//! An in-process OTLP/gRPC receiver: keeps every span and metric export it is sent.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span};
use tonic::{Request, Response, Status};

/// What the receiver was sent.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    spans: Arc<Mutex<Vec<ResourceSpans>>>,
    metrics: Arc<Mutex<Vec<ResourceMetrics>>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.spans
            .lock()
            .unwrap()
            .extend(request.into_inner().resource_spans);
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.metrics
            .lock()
            .unwrap()
            .extend(request.into_inner().resource_metrics);
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

impl Sink {
    /// Serves OTLP/gRPC on an ephemeral loopback port until the runtime ends.
    pub async fn start() -> (Sink, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .add_service(MetricsServiceServer::new(sink.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        (sink, addr)
    }

    /// Every span received, with its resource's attributes.
    pub fn spans(&self) -> Vec<(Vec<KeyValue>, Span)> {
        let mut out = Vec::new();
        for resource in self.spans.lock().unwrap().iter() {
            let attributes = resource
                .resource
                .as_ref()
                .map(|r| r.attributes.clone())
                .unwrap_or_default();
            for scope in &resource.scope_spans {
                for span in &scope.spans {
                    out.push((attributes.clone(), span.clone()));
                }
            }
        }
        out
    }

    /// Every metric received (each cumulative export repeats them; the last export comes last).
    pub fn metrics(&self) -> Vec<Metric> {
        self.metrics
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.scope_metrics.iter())
            .flat_map(|s| s.metrics.iter().cloned())
            .collect()
    }

    /// Spans received so far.
    pub fn span_count(&self) -> usize {
        self.spans().len()
    }
}

/// The value of attribute `key` as text (strings as they are, numbers formatted).
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    text(value)
}

fn text(value: &AnyValue) -> Option<String> {
    Some(match value.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(n) => n.to_string(),
        any_value::Value::DoubleValue(f) => f.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// Every attribute as `(key, text)`.
pub fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?)?)))
        .collect()
}
