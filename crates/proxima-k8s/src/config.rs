//! Discovery configuration and the Kubernetes client.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::convert::OptIn;
use crate::index::IndexConfig;
use crate::selector::{LabelSelector, SelectorError};

/// How Kubernetes discovery runs.
#[derive(Clone, Debug, Default)]
pub struct K8sConfig {
    /// Namespaces to watch; empty means all (needs cluster-wide list/watch).
    pub namespaces: Vec<String>,
    /// Services whose labels match are routed unless annotated `proxima.io/enabled:
    /// "false"`; `None`: only the annotation opts in.
    pub selector: Option<LabelSelector>,
    /// Publish Kubernetes Events for invalid annotations (needs `create` and `patch` on
    /// `events.k8s.io` events).
    pub publish_events: bool,
    /// This proxy's name in Events it publishes (`reportingInstance`), e.g. the node
    /// name; defaults to `proxima`.
    pub instance: Option<String>,
}

impl K8sConfig {
    /// Parse and set the opt-in label selector.
    pub fn with_selector(mut self, selector: &str) -> Result<Self, SelectorError> {
        self.selector = Some(selector.parse()?);
        Ok(self)
    }

    pub(crate) fn index_config(&self) -> IndexConfig {
        IndexConfig {
            opt_in: OptIn {
                selector: self.selector.clone(),
            },
            namespaces: self.namespaces.clone(),
        }
    }
}

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The named kubeconfig could not be read or used.
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: String,
        /// What was wrong with it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was named, and neither `KUBECONFIG`, `~/.kube/config` nor an
    /// in-cluster service account gave a configuration.
    #[error(
        "cannot find a Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster): {0}"
    )]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration was found but no client could be built from it.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for `kubeconfig` if given, else from `KUBECONFIG`, `~/.kube/config` or the
/// in-cluster service account, in that order ([`kube::Config::infer`]).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}
