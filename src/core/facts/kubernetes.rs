//! Which Kubernetes pod a process runs in, from the variables a pod spec sets with the downward
//! API, so that metrics and dumps carry the `pod`, `namespace` and `container` labels that
//! DCGM-exporter gives the same GPU, and the node it calls `Hostname`. Nothing is asked of the
//! cluster: a pod that does not set them gets none. In the pod spec's `env` (docs/operations.md
//! shows it whole): `POD_NAME` from `fieldRef: metadata.name`, `POD_NAMESPACE` from
//! `metadata.namespace`, `NODE_NAME` from `spec.nodeName`, and `CONTAINER_NAME` as a literal
//! `value` (the downward API has no field for it).

pub use dump::model::Kubernetes;

/// The variables read, in the order the fields are documented.
pub const VARIABLES: &[&str] = &["POD_NAME", "POD_NAMESPACE", "CONTAINER_NAME", "NODE_NAME"];

/// Longest value kept: Kubernetes names are at most 253 characters.
const MAX_VALUE: usize = 253;

/// The pod facts from `lookup` (a variable's value); `None` when none of them is set. Values are
/// trimmed; empty ones, and ones with control characters, count as unset.
pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Option<Kubernetes> {
    let get = |k: &str| {
        lookup(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty() && v.len() <= MAX_VALUE && !v.chars().any(char::is_control))
    };
    let k = Kubernetes {
        pod: get("POD_NAME"),
        namespace: get("POD_NAMESPACE"),
        container: get("CONTAINER_NAME"),
        node: get("NODE_NAME"),
    };
    (k != Kubernetes::default()).then_some(k)
}

/// This process's pod, from its environment.
pub fn current() -> Option<Kubernetes> {
    from_env(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_downward_api_variables_name_the_pod_and_nothing_else_counts() {
        let env = [
            ("POD_NAME", " trainer-0 "),
            ("POD_NAMESPACE", "ml"),
            ("NODE_NAME", "gpu-node-7"),
            ("CONTAINER_NAME", ""),
            ("HOSTNAME", "trainer-0"),
        ];
        let lookup = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        assert_eq!(
            from_env(lookup),
            Some(Kubernetes {
                pod: Some("trainer-0".into()),
                namespace: Some("ml".into()),
                container: None,
                node: Some("gpu-node-7".into()),
            })
        );
        assert_eq!(from_env(|_| None), None);
        assert_eq!(
            from_env(|_| Some("a\nb".into())),
            None,
            "control characters"
        );
        assert_eq!(
            from_env(|_| Some("x".repeat(300))),
            None,
            "too long for a name"
        );
    }
}
