//! The YAML topology file: nodes, services, their settings and endpoints.
//!
//! ```yaml
//! nodes:                                  # optional
//!   - { name: worker-1, zone: edge-a, labels: { tier: edge }, addresses: [127.0.0.1] }
//! services:
//!   - name: dps
//!     namespace: default                  # optional, default "default"
//!     ports: [{ name: http, port: 80 }]   # optional; without ports any port is accepted
//!     settings: { latency-slo: 80ms, slo-percentile: 95, strategy: qos-pool, timeout: 2s }
//!     traffic-distribution: PreferClose   # optional, as the Service field
//!     internal-traffic-policy: Cluster    # optional: Cluster or Local
//!     endpoints:
//!       - id: dps-w1                      # optional, defaults to the address
//!         address: 127.0.0.1:9001         # ip:port, or `ip` with `ports: [{ name, port }]`
//!         node: worker-1                  # optional; must be a listed node if nodes are listed
//!         zone: edge-a                    # optional, defaults to the node's zone
//!         ready: true                     # optional conditions: ready and serving default
//!         serving: true                   #   to true (each on its own, as kube-proxy),
//!         terminating: false              #   terminating to false
//!         hints: { for-zones: [edge-a] }  # optional topology hints
//! emulate: ...                            # optional, read by `proxima demo` only
//! ```
//!
//! `settings` keys are the ones a Kubernetes Service carries as `proxima.io/<key>`
//! annotations, parsed by the same [`ServiceSettings::from_pairs`]
//! (see [`proxima_core::settings`]). The file is strict where annotations are lenient: a
//! file is edited by a person who is watching, so any problem rejects the whole file and
//! is reported as `file:line: path: message`, while the previous valid topology stays
//! in force (see [`watch`]).
//!
//! [`ServiceSettings::from_pairs`]: proxima_core::ServiceSettings::from_pairs

mod schema;
mod watch;

use std::fmt;
use std::path::Path;

use proxima_core::{Endpoint, Node, ServiceSpec, Update};

pub use watch::{watch, FileWatcher, ReloadSummary, POLL_INTERVAL};

/// Everything a topology file describes, in the core's terms.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// The `nodes` section.
    pub nodes: Vec<Node>,
    /// Every service with its endpoints, in file order.
    pub services: Vec<(ServiceSpec, Vec<Endpoint>)>,
}

impl Topology {
    /// How many services the file describes.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// How many endpoints all its services have together.
    pub fn endpoint_count(&self) -> usize {
        self.services.iter().map(|(_, eps)| eps.len()).sum()
    }
}

impl From<Topology> for Update {
    /// A full replacement: the router keeps the state of endpoints whose id stays.
    fn from(t: Topology) -> Update {
        Update::Reset {
            nodes: t.nodes,
            services: t.services,
        }
    }
}

/// One thing wrong with a topology file, where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file name as given, or `<topology>` for text parsed without a name.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Path of the offending value, e.g. `services[0].settings.latency-slo`; empty when
    /// the problem is the document itself (a syntax error names its own context).
    pub path: String,
    /// What is wrong, in a sentence.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a topology file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file name as given.
        file: String,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// Every problem found, in file order (a syntax error stops at the first).
    #[error("{}", join(.0))]
    Invalid(Vec<Problem>),
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl FileError {
    /// The problems of an invalid file (empty for a read error).
    pub fn problems(&self) -> &[Problem] {
        match self {
            FileError::Invalid(p) => p,
            FileError::Read { .. } => &[],
        }
    }
}

/// Parse topology text; problems name the file as `<topology>`.
pub fn parse(text: &str) -> Result<Topology, FileError> {
    parse_named("<topology>", text)
}

/// Parse topology text read from `file` (used in messages only).
pub fn parse_named(file: &str, text: &str) -> Result<Topology, FileError> {
    let problem = |line, path: String, message: String| Problem {
        file: file.to_string(),
        line,
        path,
        message,
    };
    // An empty file is most likely one being written; never take it for "no services".
    if text.trim().is_empty() {
        return Err(FileError::Invalid(vec![problem(
            None,
            String::new(),
            "the file is empty; write `services: []` for a topology without services".into(),
        )]));
    }
    let doc: schema::Document = crate::yaml::from_str(text)
        .map_err(|e| FileError::Invalid(vec![problem(e.line, e.path.into(), e.message)]))?;
    doc.into_topology().map_err(|problems| {
        let mut problems: Vec<Problem> = problems
            .into_iter()
            .map(|p| problem(p.line, p.path, p.message))
            .collect();
        problems.sort_by_key(|p| p.line);
        FileError::Invalid(problems)
    })
}

/// Read and parse a topology file.
pub fn load(path: &Path) -> Result<Topology, FileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        file: file.clone(),
        source,
    })?;
    parse_named(&file, &text)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use proxima_core::{Conditions, ServiceKey};

    use super::*;

    const GOOD: &str = "\
nodes:
  - { name: worker-1, zone: edge-a, labels: { tier: edge, gpu: true }, addresses: [127.0.0.1] }
  - name: worker-2
    zone: edge-b
services:
  - name: dps
    ports: [{ name: http, port: 80 }]
    settings: { latency-slo: 80ms, slo-percentile: 95, strategy: qos-pool, timeout: 2s }
    endpoints:
      - id: dps-w1
        address: 127.0.0.1:9001
        node: worker-1
      - address: 127.0.0.2
        ports: [{ name: http, port: 9002 }]
        node: worker-2
        zone: edge-c
        ready: false
        terminating: true   # serving unset: serving (it does not follow ready)
  - name: ocr
    namespace: vision
    internal-traffic-policy: Local
    endpoints:
      - { address: '[::1]:9003', hints: { for-zones: [edge-a] } }
emulate:
  anything: [goes, here]
";

    fn problems(text: &str) -> Vec<Problem> {
        match parse_named("topology.yaml", text) {
            Ok(t) => panic!("expected an error, parsed {t:?}"),
            Err(e) => e.problems().to_vec(),
        }
    }

    /// The single problem of `text`, checked to be on `line` and to mention `needles`.
    fn assert_problem(text: &str, line: usize, needles: &[&str]) {
        let found = problems(text);
        assert_eq!(found.len(), 1, "{found:#?}");
        let p = &found[0];
        assert_eq!(p.line, Some(line), "wrong line in: {p}");
        let shown = p.to_string();
        assert!(
            shown.starts_with(&format!("topology.yaml:{line}: ")),
            "{shown}"
        );
        for needle in needles {
            assert!(
                shown.contains(needle),
                "{shown:?} does not mention {needle:?}"
            );
        }
    }

    #[test]
    fn parses_a_good_file() {
        let t = parse(GOOD).unwrap();
        assert_eq!(t.service_count(), 2);
        assert_eq!(t.endpoint_count(), 3);

        let w1 = &t.nodes[0];
        assert_eq!(w1.name, "worker-1");
        assert_eq!(w1.zone.as_deref(), Some("edge-a"));
        assert_eq!(w1.labels["gpu"], "true");
        assert_eq!(w1.addresses, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);

        let (dps, eps) = &t.services[0];
        assert_eq!(dps.key, ServiceKey::new("default", "dps"));
        assert_eq!(dps.ports[0].name, "http");
        assert_eq!(dps.ports[0].port, 80);
        assert_eq!(dps.settings.latency_slo, Duration::from_millis(80));
        assert_eq!(dps.settings.slo_percentile, 95.0);
        assert_eq!(dps.settings.timeout, Duration::from_secs(2));

        assert_eq!(eps[0].id, "dps-w1");
        assert_eq!(eps[0].port("http"), Some(9001));
        assert_eq!(
            eps[0].zone.as_deref(),
            Some("edge-a"),
            "inherited from the node"
        );
        assert_eq!(eps[0].conditions, Conditions::default());
        assert_eq!(eps[1].id, "127.0.0.2", "the id defaults to the address");
        assert_eq!(eps[1].port("http"), Some(9002));
        assert_eq!(eps[1].zone.as_deref(), Some("edge-c"));
        assert_eq!(
            eps[1].conditions,
            Conditions {
                ready: false,
                serving: true,
                terminating: true
            }
        );

        let (ocr, eps) = &t.services[1];
        assert_eq!(ocr.key, ServiceKey::new("vision", "ocr"));
        assert!(ocr.traffic.internal_local);
        assert_eq!(ocr.settings, proxima_core::ServiceSettings::default());
        assert_eq!(eps[0].ip, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(eps[0].id, "[::1]:9003");
        assert_eq!(*eps[0].hints.for_zones, ["edge-a"]);

        match Update::from(t) {
            Update::Reset { nodes, services } => {
                assert_eq!(nodes.len(), 2);
                assert_eq!(services.len(), 2);
            }
            other => panic!("expected a reset, got {other:?}"),
        }
    }

    #[test]
    fn a_file_of_fifty_thousand_endpoints_is_read() {
        // benches/load/scale.sh's IDLE=1 topology at its largest (issue 29): past
        // serde-saphyr's default budget of 250,000 nodes.
        let mut text = String::from("services:\n");
        for s in 0..5_000 {
            text += &format!("  - name: svc-{s}\n    endpoints:\n");
            for p in 0..10 {
                let i = s * 10 + p;
                let addr = format!("127.0.{}.{}:8080", 1 + i / 250, 1 + i % 250);
                text += &format!("      - {{ id: svc-{s}-{p}, address: {addr} }}\n");
            }
        }
        let t = parse(&text).unwrap();
        assert_eq!((t.service_count(), t.endpoint_count()), (5_000, 50_000));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let text = "services:\n  - name: dps\n    endpoints: [\n      { address: 127.0.0.1:1 \n";
        let p = &problems(text)[0];
        assert!(p.line.is_some(), "{p}");
        assert!(p.to_string().starts_with("topology.yaml:"), "{p}");

        assert_problem("services:\n  - name: dps\n\tbad: tab\n", 3, &["tab"]);
    }

    #[test]
    fn unknown_fields_name_the_line_and_field() {
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:1\n        nod: worker-1\n";
        assert_problem(
            text,
            5,
            &["services[0].endpoints[0]", "unknown field `nod`"],
        );
        assert_problem("servcies: []\n", 1, &["unknown field `servcies`"]);
    }

    #[test]
    fn wrong_types_name_the_line_and_field() {
        let text = "services:\n  - name: dps\n    ports:\n      - port: http\n";
        assert_problem(
            text,
            4,
            &[
                "services[0].ports[0].port",
                "invalid value \"http\": expected u16",
            ],
        );
        let text = "services:\n  - name: dps\n    ports: [{ port: 70000 }]\n";
        assert_problem(text, 3, &["services[0].ports[0].port", "70000"]);
        let text = "services:\n  - name: dps\n    settings:\n      timeout: [2s]\n";
        assert_problem(
            text,
            4,
            &["services[0].settings.timeout", "string, number or boolean"],
        );
        let text = "nodes:\n  - name: w\n    addresses: [localhost]\n";
        assert_problem(text, 3, &["nodes[0].addresses[0]", "IP address"]);
    }

    #[test]
    fn invalid_setting_values_name_the_line_and_key() {
        let text = "\
services:
  - name: dps
    endpoints: [{ address: 127.0.0.1:1 }]
  - name: web
    settings:
      strategy: qos-pool
      latency-slo: 80
    endpoints: [{ address: 127.0.0.1:2 }]
";
        assert_problem(
            text,
            7,
            &[
                "services[1].settings.latency-slo: invalid value \"80\"",
                "80ms",
            ],
        );
        let text = "services:\n  - name: dps\n    settings: { slo-percentile: 150 }\n";
        assert_problem(text, 3, &["services[0].settings.slo-percentile", "\"150\""]);
        // A key rejected for another's value need not be in the file: the mapping's line.
        let text = "services:\n  - name: dps\n    settings:\n      qos-pool-window: 2\n";
        assert_problem(
            text,
            4,
            &["services[0].settings.qos-pool-min-samples", "at most"],
        );
    }

    #[test]
    fn misspelt_setting_keys_are_rejected() {
        let text = "services:\n  - name: dps\n    settings:\n      timeout: 1s\n      latency-sloo: 80ms\n";
        assert_problem(
            text,
            5,
            &["services[0].settings.latency-sloo", "unknown setting"],
        );
        let text = "services:\n  - name: dps\n    settings:\n      slo: 80ms\n";
        assert_problem(text, 4, &["services[0].settings.slo", "known key"]);
        // Parameters of the service's own strategy are fine.
        let text = "services:\n  - name: dps\n    settings: { strategy: proximity, proximity-alpha: 0.5 }\n";
        let t = parse(text).unwrap();
        assert_eq!(
            t.services[0].0.settings.param("proximity", "alpha"),
            Some("0.5")
        );
    }

    #[test]
    fn bad_addresses_name_the_line() {
        let text = "services:\n  - name: dps\n    endpoints:\n      - id: a\n        address: 127.0.0.1:1\n      - id: b\n        address: 127.0.0.300:80\n";
        assert_problem(
            text,
            7,
            &[
                "services[0].endpoints[1].address",
                "127.0.0.300:80",
                "ip:port",
            ],
        );
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1\n";
        assert_problem(text, 4, &["services[0].endpoints[0].address", "no port"]);
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:0\n";
        assert_problem(text, 4, &["services[0].endpoints[0].address", "port 0"]);
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:80\n        ports: [{ port: 81 }]\n";
        assert_problem(text, 5, &["services[0].endpoints[0].ports", "either"]);
    }

    #[test]
    fn duplicates_name_the_second_occurrence() {
        let text = "\
services:
  - name: dps
    endpoints:
      - id: a
        address: 127.0.0.1:1
      - id: a
        address: 127.0.0.1:2
  - name: dps
    namespace: default
";
        let found = problems(text);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0].line, Some(6), "{}", found[0]);
        assert_eq!(found[0].path, "services[0].endpoints[1].id");
        assert!(
            found[0].message.contains("duplicate endpoint id \"a\""),
            "{}",
            found[0]
        );
        assert_eq!(found[1].line, Some(8), "{}", found[1]);
        assert_eq!(found[1].path, "services[1].name");
        assert!(
            found[1].message.contains("duplicate service dps.default"),
            "{}",
            found[1]
        );

        // An id taken from the address points at the endpoint itself.
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:1\n      - address: 127.0.0.1:1\n";
        assert_problem(
            text,
            5,
            &["services[0].endpoints[1].id", "duplicate endpoint id"],
        );

        let text = "nodes: [{ name: w }, { name: w }]\n";
        assert_problem(text, 1, &["nodes[1].name", "duplicate node"]);
    }

    #[test]
    fn names_and_node_references_are_checked() {
        let text = "services:\n  - name: Dps.x\n";
        assert_problem(text, 2, &["services[0].name", "DNS label"]);
        let text = "nodes: [{ name: w1 }]\nservices:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:1\n        node: w2\n";
        assert_problem(
            text,
            6,
            &["services[0].endpoints[0].node", "unknown node \"w2\"", "w1"],
        );
    }

    #[test]
    fn a_ports_protocol_is_read() {
        let topology = parse(
            "services:\n  - name: api\n    ports: [{ name: rpc, port: 50051, protocol: grpc }]\n    endpoints:\n      - address: 127.0.0.1\n        ports: [{ name: rpc, port: 9000, protocol: kubernetes.io/h2c }]\n",
        )
        .expect("valid");
        let (spec, endpoints) = &topology.services[0];
        assert_eq!(spec.ports[0].app_protocol.as_deref(), Some("grpc"));
        assert_eq!(
            endpoints[0].ports[0].app_protocol.as_deref(),
            Some("kubernetes.io/h2c")
        );
        let error =
            parse("services:\n  - name: api\n    ports: [{ name: rpc, port: 1, proto: grpc }]\n")
                .expect_err("unknown key");
        assert!(error.to_string().contains("proto"), "{error}");
    }

    #[test]
    fn every_problem_is_reported_in_file_order() {
        let text = "\
services:
  - name: dps
    settings:
      latency-slo: soon
      retries: many
    endpoints:
      - address: nowhere
";
        let lines: Vec<_> = problems(text).iter().map(|p| p.line).collect();
        assert_eq!(lines, [Some(4), Some(5), Some(7)]);
    }

    #[test]
    fn empty_files_are_rejected_but_empty_topologies_are_not() {
        assert!(parse("  \n").is_err());
        let t = parse("services: []\n").unwrap();
        assert_eq!(t.service_count(), 0);
        let t = parse("{}\n").unwrap();
        assert_eq!(t.service_count(), 0);
    }
    #[test]
    fn anchors_aliases_and_merge_keys_are_read() {
        let text = "\
services:
  - name: dps
    settings: &slo { latency-slo: 80ms, slo-percentile: 95 }
    endpoints: [{ address: 127.0.0.1:1 }]
  - name: ocr
    settings: *slo
    endpoints: [{ address: 127.0.0.1:2 }]
  - name: web
    settings: { <<: *slo, timeout: 3s }
";
        let t = parse(text).unwrap();
        for (spec, _) in &t.services {
            assert_eq!(spec.settings.latency_slo, Duration::from_millis(80));
            assert_eq!(spec.settings.slo_percentile, 95.0);
        }
        assert_eq!(t.services[2].0.settings.timeout, Duration::from_secs(3));
        // A problem in a repeated value is shown where it is repeated.
        let text = "services:\n  - name: a\n    settings: &s { retries: many }\n  - name: b\n    settings: *s\n";
        let lines: Vec<_> = problems(text).iter().map(|p| p.line).collect();
        assert_eq!(lines, [Some(3), Some(5)]);
    }

    #[test]
    fn settings_and_labels_take_text_numbers_and_booleans_as_written() {
        let text = "\
nodes:
  - { name: w, labels: { gpu: true, rack: 7, power: off, site: '01' } }
services:
  - name: dps
    settings: { latency-slo: 80ms, slo-percentile: 99.5, retries: '2', qos-pool-window: 40 }
";
        let t = parse(text).unwrap();
        let labels = &t.nodes[0].labels;
        // `off` is text, as in YAML 1.2 (not YAML 1.1's false).
        assert_eq!(
            [
                &labels["gpu"],
                &labels["rack"],
                &labels["power"],
                &labels["site"]
            ],
            ["true", "7", "off", "01"]
        );
        let settings = &t.services[0].0.settings;
        assert_eq!(settings.slo_percentile, 99.5);
        assert_eq!(settings.retries, 2);
        assert_eq!(settings.qos_pool.window, 40);
        // A boolean is `true` or `false`: `yes` is not one.
        let text = "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:1\n        ready: yes\n";
        assert_problem(
            text,
            5,
            &["services[0].endpoints[0].ready", "invalid boolean"],
        );
    }

    #[test]
    fn keys_written_twice_are_rejected_where_repeated() {
        let text =
            "services:\n  - name: dps\n    settings:\n      timeout: 1s\n      timeout: 2s\n";
        assert_problem(
            text,
            5,
            &["services[0].settings: duplicate mapping key: timeout"],
        );
        let text = "services:\n  - name: dps\n    name: web\n";
        assert_problem(text, 3, &["services[0]: duplicate mapping key: name"]);
    }

    #[test]
    fn comments_only_is_an_empty_topology_and_two_documents_are_refused() {
        let t = parse("# nothing yet\n# services: []\n").unwrap();
        assert_eq!(t.service_count(), 0);
        let text = "services: []\n---\nservices: []\n";
        assert_problem(text, 3, &["multiple"]);
    }
}
