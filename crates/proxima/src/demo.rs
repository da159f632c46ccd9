//! `proxima demo`: the proxy in front of emulated pods, for a first look without a
//! cluster.
//!
//! The topology (built in from `examples/demo/topology.yaml`, or `--topology`) is an
//! ordinary topology file plus an `emulate.pods` section: for each entry the demo starts
//! a `proxima_emulate::Backend` with the given processing delay on 127.0.0.1 (on the
//! endpoint's own address if it has one, else on a free port), writes the endpoints'
//! real addresses into the file the proxy follows, and then runs exactly what
//! `proxima run --discovery file:<that file>` runs. A small load generator sends a few
//! requests per second to each service so that the QoS pools form on their own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use indexmap::IndexMap;
use proxima_core::settings::parse_duration;
use proxima_core::{Router, ServiceKey};
use proxima_discovery::yaml;
use proxima_emulate::{Backend, BackendConfig};
use serde::{Deserialize, Serialize};

use crate::cli::{DemoArgs, Discovery, KubeArgs};
use crate::load;
use crate::run::{serve, DiscoveryPlan, Ports};
use crate::shutdown::Shutdown;

/// The built-in demo topology.
const DEFAULT_TOPOLOGY: &str = include_str!("../../../examples/demo/topology.yaml");

/// Put at the top of the written file.
const HEADER: &str = "\
# Written by `proxima demo`, which follows this file: edit it while the demo runs
# (change a latency-slo, remove or add an endpoint) and the proxy reloads it. The
# endpoints' addresses are the demo's emulated pods. The demo overwrites this file
# when it starts again.
";

/// The part of the topology that only the demo reads. Other keys are discovery's.
#[derive(Debug, Default, Deserialize)]
struct DemoFile {
    #[serde(default)]
    emulate: Emulate,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Emulate {
    #[serde(default)]
    pods: Vec<PodSpec>,
}

/// One emulated pod: which endpoint it is and how slow it answers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodSpec {
    service: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    endpoint: String,
    delay: String,
    jitter: Option<String>,
}

fn default_namespace() -> String {
    ServiceKey::DEFAULT_NAMESPACE.to_string()
}

/// The topology as a tree, written back in its own order (`serde_json::Value`, the tree
/// serde-saphyr leaves to others, would sort the keys).
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
enum Tree {
    Map(IndexMap<String, Tree>),
    List(Vec<Tree>),
    Text(String),
    /// A number, a boolean or null.
    Other(serde_json::Value),
}

type Map = IndexMap<String, Tree>;

impl Tree {
    fn text(&self, key: &str) -> Option<&str> {
        match self {
            Tree::Map(map) => match map.get(key)? {
                Tree::Text(text) => Some(text),
                _ => None,
            },
            _ => None,
        }
    }
}

struct EmulatedPod {
    service: String,
    endpoint: String,
    node: String,
    delay: Duration,
    backend: Backend,
}

/// `proxima demo`: start the emulated pods, write the topology the proxy follows, and
/// serve until a signal or a failure.
pub async fn run(args: DemoArgs) -> Result<()> {
    let (source, text) = match &args.topology {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        ),
        None => (
            "the built-in demo topology".to_string(),
            DEFAULT_TOPOLOGY.to_string(),
        ),
    };
    if !(args.load.is_finite() && args.load >= 0.0) {
        bail!("--load must be a number of requests per second, 0 or more");
    }
    let plan: DemoFile = yaml::from_str(&text).map_err(|e| anyhow!("{source}: {e}"))?;
    let mut doc: Tree = yaml::from_str(&text).map_err(|e| anyhow!("{source}: {e}"))?;

    let shutdown = Shutdown::new();
    shutdown.on_signals();

    let mut pods = Vec::with_capacity(plan.emulate.pods.len());
    for (i, spec) in plan.emulate.pods.iter().enumerate() {
        let at = format!("{source}: emulate.pods[{i}]");
        pods.push(start_pod(&mut doc, spec).await.context(at)?);
    }
    if let Tree::Map(map) = &mut doc {
        map.shift_remove("emulate");
    }
    let yaml = serde_saphyr::to_string(&doc).context("cannot write the demo topology")?;
    std::fs::write(&args.write, format!("{HEADER}{yaml}"))
        .with_context(|| format!("cannot write {}", args.write.display()))?;
    let file = std::path::absolute(&args.write).unwrap_or_else(|_| args.write.clone());
    let topology = proxima_discovery::load(&file).map_err(|e| anyhow!("{e}"))?;

    let node = args
        .serve
        .proxy
        .node_name
        .clone()
        .or_else(|| topology.nodes.first().map(|n| n.name.clone()));
    let router = Arc::new(Router::new(node.clone()));
    let services: Vec<String> = topology
        .services
        .iter()
        .map(|(spec, _)| spec.key.to_string())
        .collect();
    let ports = Ports {
        proxy: args.serve.listen,
        admin: args.serve.admin,
    };
    let header = args.serve.proxy.service_header.clone();
    let result = serve(
        ports,
        &args.serve.proxy,
        DiscoveryPlan {
            discovery: &Discovery::File(file.clone()),
            kube: &KubeArgs::default(),
        },
        router,
        &shutdown,
        |bound| {
            print_banner(&Banner {
                pods: &pods,
                services: &services,
                nodes: topology.nodes.len(),
                node: node.as_deref(),
                file: &file,
                bound,
                header: header.as_str(),
                load: args.load,
            });
            if args.load > 0.0 {
                tokio::spawn(load::run(
                    bound.proxy,
                    header.clone(),
                    services.clone(),
                    args.load,
                    shutdown.wait(),
                ));
            }
        },
    )
    .await;
    for pod in pods {
        pod.backend.shutdown().await;
    }
    result
}

/// Start the pod and write its address into its endpoint in `doc`.
async fn start_pod(doc: &mut Tree, spec: &PodSpec) -> Result<EmulatedPod> {
    let duration = |what: &str, value: &str| {
        parse_duration(value)
            .ok_or_else(|| anyhow!("{what}: {value:?} is not a duration (e.g. 20ms)"))
    };
    let delay = duration("delay", &spec.delay)?;
    let jitter = match &spec.jitter {
        Some(j) => duration("jitter", j)?,
        None => Duration::ZERO,
    };
    let service = format!("{}.{}", spec.service, spec.namespace);
    let endpoint =
        find_endpoint(doc, &spec.namespace, &spec.service, &spec.endpoint).ok_or_else(|| {
            anyhow!(
                "no endpoint with id {:?} in service {service}",
                spec.endpoint
            )
        })?;
    let listen = match endpoint.get("address") {
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        Some(address) => {
            let address = match address {
                Tree::Text(text) => text.as_str(),
                _ => "",
            };
            let addr: SocketAddr = address.parse().map_err(|_| {
                anyhow!("address {address:?} of an emulated pod must be ip:port (or left out)")
            })?;
            if !addr.ip().is_loopback() {
                bail!("emulated pods listen on loopback addresses only, not {addr}");
            }
            addr
        }
    };
    let backend = Backend::spawn(
        listen,
        BackendConfig::new(spec.endpoint.clone())
            .delay(delay)
            .jitter(jitter),
    )
    .await
    .with_context(|| format!("cannot start emulated pod {} on {listen}", spec.endpoint))?;
    endpoint.insert("address".into(), Tree::Text(backend.addr().to_string()));
    endpoint.shift_remove("ports");
    let node = match endpoint.get("node") {
        Some(Tree::Text(node)) => node.clone(),
        _ => "-".to_string(),
    };
    Ok(EmulatedPod {
        service,
        endpoint: spec.endpoint.clone(),
        node,
        delay,
        backend,
    })
}

fn find_endpoint<'v>(
    doc: &'v mut Tree,
    namespace: &str,
    service: &str,
    id: &str,
) -> Option<&'v mut Map> {
    let list = |tree: &'v mut Tree, key: &str| match tree {
        Tree::Map(map) => match map.get_mut(key)? {
            Tree::List(list) => Some(list),
            _ => None,
        },
        _ => None,
    };
    let service = list(doc, "services")?.iter_mut().find(|s| {
        s.text("name") == Some(service)
            && s.text("namespace").unwrap_or(ServiceKey::DEFAULT_NAMESPACE) == namespace
    })?;
    match list(service, "endpoints")?
        .iter_mut()
        .find(|e| e.text("id") == Some(id))?
    {
        Tree::Map(endpoint) => Some(endpoint),
        _ => None,
    }
}

struct Banner<'a> {
    pods: &'a [EmulatedPod],
    services: &'a [String],
    nodes: usize,
    node: Option<&'a str>,
    file: &'a Path,
    bound: Ports,
    header: &'a str,
    load: f64,
}

/// `localhost:PORT` for a loopback or wildcard address, else the address itself.
fn reach(addr: SocketAddr) -> String {
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        format!("localhost:{}", addr.port())
    } else {
        addr.to_string()
    }
}

fn print_banner(b: &Banner<'_>) {
    let mut out = format!(
        "\nproxima demo: {} emulated pods of {} services on {} nodes",
        b.pods.len(),
        b.services.len(),
        b.nodes
    );
    if let Some(node) = b.node {
        out.push_str(&format!("; the proxy runs as if on {node}"));
    }
    out.push_str("\n\n");
    out.push_str(&format!(
        "  {:<14} {:<10} {:<10} {:<22} {}\n",
        "SERVICE", "POD", "NODE", "ADDRESS", "DELAY"
    ));
    for pod in b.pods {
        out.push_str(&format!(
            "  {:<14} {:<10} {:<10} {:<22} {:?}\n",
            pod.service,
            pod.endpoint,
            pod.node,
            pod.backend.addr(),
            pod.delay
        ));
    }
    out.push_str(&format!(
        "\nTopology: {}\n  The proxy follows this file: edit it (change a latency-slo, remove an \
         endpoint)\n  and the log shows the reload.\n",
        b.file.display()
    ));
    if b.load > 0.0 {
        out.push_str(&format!(
            "Load: {} requests/s to each service (--load 0 for none).\n",
            b.load
        ));
    }
    let first = b.services.first().map_or("SERVICE", |s| {
        s.strip_suffix(".default").unwrap_or(s.as_str())
    });
    let (proxy, admin) = (reach(b.bound.proxy), reach(b.bound.admin));
    out.push_str(&format!(
        "\nTry this:\n  curl -H '{}: {first}' {proxy}/\n  curl {admin}/debug/pools\n  \
         curl -s {admin}/metrics | grep '^proxima_'\n\nCtrl-C stops the demo.\n",
        b.header
    ));
    println!("{out}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_topology_names_real_endpoints() {
        let plan: DemoFile = yaml::from_str(DEFAULT_TOPOLOGY).unwrap();
        assert_eq!(plan.emulate.pods.len(), 5);
        let mut doc: Tree = yaml::from_str(DEFAULT_TOPOLOGY).unwrap();
        let mut delays = Vec::new();
        for pod in &plan.emulate.pods {
            let endpoint = find_endpoint(&mut doc, &pod.namespace, &pod.service, &pod.endpoint)
                .unwrap_or_else(|| panic!("{} is not in the topology", pod.endpoint));
            endpoint.insert("address".into(), Tree::Text("127.0.0.1:9".into()));
            delays.push(parse_duration(&pod.delay).unwrap());
        }
        delays.sort();
        delays.dedup();
        assert!(delays.len() >= 4, "pods differ in speed: {delays:?}");
        // Once addresses are filled in, it is a valid topology for discovery.
        let yaml = serde_saphyr::to_string(&doc).unwrap();
        // Written back in the file's order: a service's name before its endpoints.
        let at = |text: &str| yaml.find(text).unwrap();
        assert!(at("name: dps") < at("latency-slo: 80ms"), "{yaml}");
        assert!(at("slo-percentile: 95") < at("id: dps-w1"), "{yaml}");
        let t = proxima_discovery::parse(&yaml).unwrap();
        assert_eq!(
            (t.service_count(), t.endpoint_count(), t.nodes.len()),
            (2, 5, 3)
        );
    }
}
