//! OpenTelemetry traces over OTLP/gRPC (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`): the engine hands finished spans to the
//! [`Tracer`], which queues them (bounded) for one export task.
//!
//! A run's spans are built from its committed events (see
//! `engine::traced`): `invoke_agent` for the run, and as its children
//! `chat {model}`, `execute_tool {name}` per attempt, and `aaa.approval
//! {tool}` from a call's request to its decision. Each is exported when it
//! ends, the run span when the run ends; their ids are fixed by what they
//! are ([`context`]), so a run that waits a day shows its finished parts
//! at once, under the run span that arrives at its end.
//!
//! Export never slows a run: a full queue drops the span, a failed export
//! drops its batch (both counted in `aaa_trace_spans_dropped_total`), and
//! an unreachable collector costs only the export task's time. Sampling (`OTEL_TRACES_SAMPLER`,
//! `OTEL_TRACES_SAMPLER_ARG`) and resource attributes (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`) come from the standard variables.

pub mod context;

use std::time::Duration;

use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

pub use context::TraceContext;

use crate::metrics::Metrics;

/// Spans waiting for the export task; more are dropped.
const QUEUE: usize = 4096;
/// Most spans in one export.
const BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which traces are kept (`OTEL_TRACES_SAMPLER`). Decided per trace from
/// its id (and the starter's decision for the parent-based ones), so
/// every span of a run, on any server, is kept or dropped together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampler {
    AlwaysOn,
    AlwaysOff,
    /// Keeps this fraction of traces, by trace id.
    Ratio(f64),
    /// The starter's decision when it sent one, else the inner sampler's.
    ParentBased(Root),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
}

impl Sampler {
    /// The sampler the standard variables name; the default is
    /// `parentbased_always_on`.
    pub fn from_env(sampler: Option<&str>, arg: Option<&str>) -> Result<Sampler, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(text) => match text.trim().parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(format!(
                        "OTEL_TRACES_SAMPLER_ARG '{text}' is not a ratio from 0 to 1"
                    )),
                },
            }
        };
        Ok(
            match sampler.map(str::trim).unwrap_or("parentbased_always_on") {
                "always_on" => Sampler::AlwaysOn,
                "always_off" => Sampler::AlwaysOff,
                "traceidratio" => Sampler::Ratio(ratio()?),
                "parentbased_always_on" => Sampler::ParentBased(Root::AlwaysOn),
                "parentbased_always_off" => Sampler::ParentBased(Root::AlwaysOff),
                "parentbased_traceidratio" => Sampler::ParentBased(Root::Ratio(ratio()?)),
                other => {
                    return Err(format!(
                        "OTEL_TRACES_SAMPLER '{other}' is not one of always_on, always_off, \
                     traceidratio, parentbased_always_on, parentbased_always_off, \
                     parentbased_traceidratio"
                    ))
                }
            },
        )
    }

    pub fn samples(&self, trace: &TraceContext) -> bool {
        let by_ratio = |ratio: f64| {
            // The low 8 bytes of the id, as the SDK's ratio sampler reads them.
            let mut low = [0; 8];
            low.copy_from_slice(&trace.trace_id[8..]);
            let value = u64::from_be_bytes(low) >> 1;
            (value as f64) < ratio * (1u64 << 63) as f64
        };
        match *self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            Sampler::Ratio(ratio) => by_ratio(ratio),
            Sampler::ParentBased(_) if trace.parent.is_some() => trace.sampled,
            Sampler::ParentBased(Root::AlwaysOn) => true,
            Sampler::ParentBased(Root::AlwaysOff) => false,
            Sampler::ParentBased(Root::Ratio(ratio)) => by_ratio(ratio),
        }
    }
}

/// Where the engine's spans go.
pub struct Tracer {
    queue: mpsc::Sender<SpanData>,
    sampler: Sampler,
    scope: InstrumentationScope,
    metrics: Metrics,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sampler", &self.sampler)
            .finish()
    }
}

impl Tracer {
    /// Exports to the OTLP/gRPC collector at `endpoint` (say
    /// `http://127.0.0.1:4317`) from a task on the current runtime, which
    /// ends once the tracer is dropped.
    pub fn start(endpoint: &str, sampler: Sampler, metrics: Metrics) -> Result<Tracer, String> {
        use opentelemetry_otlp::WithExportConfig;
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| format!("OTLP endpoint '{endpoint}': {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(format!(
                "OTLP endpoint '{endpoint}': give a URL such as http://127.0.0.1:4317"
            ));
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("OTLP exporter for '{endpoint}': {e}"))?;
        exporter.set_resource(&resource());
        let (queue, spans) = mpsc::channel(QUEUE);
        tokio::spawn(export(
            spans,
            exporter,
            endpoint.to_string(),
            metrics.clone(),
        ));
        Ok(Tracer {
            queue,
            sampler,
            scope: InstrumentationScope::builder("aaa")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            metrics,
        })
    }

    /// Are the spans of this trace kept?
    pub fn samples(&self, trace: &TraceContext) -> bool {
        self.sampler.samples(trace)
    }

    /// Who made the spans, as each span says.
    pub fn scope(&self) -> &InstrumentationScope {
        &self.scope
    }

    /// Queues a finished span; drops it (and counts it) when the queue is
    /// full.
    pub fn emit(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.metrics.families().trace_spans_dropped.inc();
        }
    }
}

/// The service's resource: `service.name` is `aaa` unless the standard
/// variables name another.
fn resource() -> Resource {
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    let builder = Resource::builder();
    match named {
        true => builder.build(),
        false => builder.with_service_name("aaa").build(),
    }
}

/// Sends the queued spans in batches until the tracer is gone. A failed
/// export is logged (once until one succeeds) and its spans dropped.
async fn export(
    mut spans: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    metrics: Metrics,
) {
    let mut failing = false;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let Some(first) = spans.recv().await else {
            break;
        };
        batch.push(first);
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        while batch.len() < BATCH {
            tokio::select! {
                span = spans.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
                () = &mut linger => break,
            }
        }
        let sent = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        let count = sent.len() as u64;
        let failure = match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(sent)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {EXPORT_TIMEOUT:?}")),
        };
        match failure {
            None => failing = false,
            Some(why) => {
                metrics.families().trace_spans_dropped.inc_by(count);
                if !failing {
                    failing = true;
                    tracing::warn!(
                        "traces: export to {endpoint} failed ({why}); its spans are dropped"
                    );
                }
            }
        }
    }
    let _ = exporter.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_come_from_the_standard_variables() {
        assert_eq!(
            Sampler::from_env(None, None),
            Ok(Sampler::ParentBased(Root::AlwaysOn))
        );
        assert_eq!(
            Sampler::from_env(Some("traceidratio"), Some("0.25")),
            Ok(Sampler::Ratio(0.25))
        );
        assert!(Sampler::from_env(Some("traceidratio"), Some("2"))
            .unwrap_err()
            .contains("ratio"));
        assert!(Sampler::from_env(Some("sometimes"), None)
            .unwrap_err()
            .contains("sometimes"));
    }

    #[test]
    fn a_parent_based_sampler_follows_the_starter() {
        let mut trace = TraceContext {
            trace_id: [7; 16],
            parent: Some([1; 8]),
            sampled: false,
        };
        let sampler = Sampler::ParentBased(Root::AlwaysOn);
        assert!(!sampler.samples(&trace));
        trace.sampled = true;
        assert!(sampler.samples(&trace));
        trace.parent = None;
        assert!(Sampler::Ratio(1.0).samples(&trace));
        assert!(!Sampler::Ratio(0.0).samples(&trace));
    }
}
