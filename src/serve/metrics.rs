//! The server's Prometheus metrics (`GET /metrics`, OpenMetrics text).

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// `predict`, `infer`, `status`, `metadata`, `health`, `metrics`, `other`.
    endpoint: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    rows: Counter,
    batch_rows: Histogram,
    version: Gauge<i64, AtomicI64>,
    step: Gauge<i64, AtomicI64>,
    reload_failures: Counter,
    executions: std::sync::atomic::AtomicU64,
    infer_ok: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    infer_failed: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    last_inference_ms: std::sync::atomic::AtomicU64,
}

/// See `Metrics::inference_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InferenceStats {
    pub success: (u64, u64),
    pub fail: (u64, u64),
    pub rows: u64,
    pub executions: u64,
    pub last_ms: u64,
}

fn latency_histogram() -> Histogram {
    // 50 us to about 1.6 s.
    Histogram::new(exponential_buckets(5e-5, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rustrec_serve");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint and status code",
            requests.clone(),
        );
        let latency = Family::<EndpointLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer",
            latency.clone(),
        );
        let rows = Counter::default();
        registry.register("rows_scored", "Rows scored by the model", rows.clone());
        let batch_rows = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        registry.register(
            "batch_rows",
            "Rows per model run (requests merged when batching is on)",
            batch_rows.clone(),
        );
        let version = Gauge::<i64, AtomicI64>::default();
        registry.register("model_version", "The version being served", version.clone());
        let step = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "model_global_step",
            "The global step of the weights served (the export's, or its last incremental update's)",
            step.clone(),
        );
        let reload_failures = Counter::default();
        registry.register(
            "model_load_failures",
            "New versions that failed to load and were not swapped in",
            reload_failures.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            rows,
            batch_rows,
            version,
            step,
            reload_failures,
            executions: Default::default(),
            infer_ok: Default::default(),
            infer_failed: Default::default(),
            last_inference_ms: Default::default(),
        }
    }

    /// Triton's statistics of inference requests: (count, total ns) of the
    /// answered and the refused, rows scored and model runs.
    pub fn inference_stats(&self) -> InferenceStats {
        use std::sync::atomic::Ordering::Relaxed;
        InferenceStats {
            success: (self.infer_ok.0.load(Relaxed), self.infer_ok.1.load(Relaxed)),
            fail: (self.infer_failed.0.load(Relaxed), self.infer_failed.1.load(Relaxed)),
            rows: self.rows.get(),
            executions: self.executions.load(Relaxed),
            last_ms: self.last_inference_ms.load(Relaxed),
        }
    }

    /// Counts one inference request for the statistics endpoint.
    pub fn inference(&self, ok: bool, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let (n, ns) = if ok { &self.infer_ok } else { &self.infer_failed };
        n.fetch_add(1, Relaxed);
        ns.fetch_add(took.as_nanos() as u64, Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.store(now, Relaxed);
    }

    pub fn request(&self, endpoint: &str, code: u16, took: Duration) {
        let endpoint = endpoint.to_string();
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.clone(),
                code,
            })
            .inc();
        self.latency
            .get_or_create(&EndpointLabels { endpoint })
            .observe(took.as_secs_f64());
    }

    pub fn batch(&self, rows: usize) {
        self.rows.inc_by(rows as u64);
        self.batch_rows.observe(rows as f64);
        self.executions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn serving(&self, version: u64, step: u64) {
        self.version.set(version as i64);
        self.step.set(step as i64);
    }

    pub fn load_failed(&self) {
        self.reload_failures.inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
    }
}

/// OpenMetrics text as Prometheus' classic text format (0.0.4): a
/// counter's family is named after its `_total` samples, and the `# UNIT`
/// and `# EOF` lines, which classic parsers do not know, are left out.
pub fn classic(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|t| t.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}").trim_end().to_string())
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_after_their_samples() {
        let m = Metrics::new();
        m.request("predict", 200, Duration::from_millis(3));
        let open = m.text();
        assert!(
            open.contains("# TYPE rustrec_serve_requests counter") && open.ends_with("# EOF\n"),
            "{open}"
        );
        let text = classic(&open);
        assert!(text.contains("# TYPE rustrec_serve_requests_total counter"), "{text}");
        assert!(text.contains("# HELP rustrec_serve_requests_total "), "{text}");
        assert!(
            text.contains("rustrec_serve_requests_total{endpoint=\"predict\",code=\"200\"} 1"),
            "{text}"
        );
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        // Histograms and gauges keep their names.
        assert!(
            text.contains("# TYPE rustrec_serve_request_duration_seconds histogram"),
            "{text}"
        );
    }
}
