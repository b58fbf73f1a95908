//! The configuration in effect as `KubeletConfiguration` v1beta1 JSON, for the kubelet API's
//! `/configz` (the kubelet's `pkg/kubelet/server` configz handler): field names as in a config file,
//! durations as Go duration strings, so the output can be fed back as a config file.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::file::{API_VERSION, KIND};
use super::{CgroupDriver, KubeletConfiguration};

impl KubeletConfiguration {
    /// The `/configz` body: `{"kubeletconfig": {...}}`.
    pub fn configz(&self) -> Value {
        let mut config = self.to_v1beta1();
        if let Value::Object(fields) = &mut config {
            fields.extend(
                self.node
                    .configz()
                    .chain(self.container_logs.configz())
                    .chain(self.dns.configz())
                    .chain(self.eviction.configz())
                    .chain(self.image_gc.configz())
                    .chain(self.shutdown.configz())
                    .chain(self.image_pull.configz())
                    .chain(self.resources.configz())
                    .map(|(name, value)| (name.to_owned(), value)),
            );
        }
        json!({ "kubeletconfig": config })
    }

    fn to_v1beta1(&self) -> Value {
        let path =
            |p: &Option<std::path::PathBuf>| p.as_deref().map(Path::display).map(|d| d.to_string());
        json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "enableServer": self.enable_server,
            "staticPodPath": path(&self.static_pod_path),
            "staticPodURL": self.static_pod_url,
            "staticPodURLHeader": self.static_pod_url_header,
            "fileCheckFrequency": go_duration(self.file_check_frequency),
            "httpCheckFrequency": go_duration(self.http_check_frequency),
            "syncFrequency": go_duration(self.sync_frequency),
            "address": self.address.to_string(),
            "port": self.port,
            "readOnlyPort": self.read_only_port.unwrap_or(0),
            "healthzPort": self.healthz_port.unwrap_or(0),
            "healthzBindAddress": self.healthz_bind_address.to_string(),
            "tlsCertFile": path(&self.tls_cert_file),
            "tlsPrivateKeyFile": path(&self.tls_private_key_file),
            "rotateCertificates": self.rotate_certificates,
            "serverTLSBootstrap": self.server_tls_bootstrap,
            "tlsCipherSuites": self.tls_cipher_suites,
            "tlsMinVersion": self.tls_min_version,
            "allowedUnsafeSysctls": self.sysctls.allowed_unsafe(),
            "authentication": {
                "x509": { "clientCAFile": path(&self.authentication.x509_client_ca_file) },
                "webhook": {
                    "enabled": self.authentication.webhook_enabled,
                    "cacheTTL": go_duration(self.authentication.webhook_cache_ttl),
                },
                "anonymous": { "enabled": self.authentication.anonymous_enabled },
            },
            "authorization": {
                "mode": self.authorization.mode.as_str(),
                "webhook": {
                    "cacheAuthorizedTTL": go_duration(self.authorization.webhook_cache_authorized_ttl),
                    "cacheUnauthorizedTTL": go_duration(self.authorization.webhook_cache_unauthorized_ttl),
                },
            },
            "streamingConnectionIdleTimeout": go_duration(self.streaming_connection_idle_timeout),
            "podLogsDir": self.pod_logs_dir.display().to_string(),
            "cgroupDriver": match self.cgroup_driver {
                CgroupDriver::Cgroupfs => "cgroupfs",
                CgroupDriver::Systemd => "systemd",
            },
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": self.cgroups_per_qos,
            "maxPods": self.max_pods,
            "podsPerCore": self.pods_per_core,
            "runtimeRequestTimeout": go_duration(self.runtime_request_timeout),
            "containerRuntimeEndpoint": self.container_runtime_endpoint,
            "enableDebuggingHandlers": self.enable_debugging_handlers,
            "runOnce": self.run_once,
            "plegMode": self.pleg_mode.as_str(),
            "ioEngine": self.io_engine.as_str(),
            "plegRelistPeriod": self.pleg_relist_period.map(go_duration),
        })
    }
}

/// A duration as Go's `time.Duration.String()` writes whole-second values: `1h2m3s`, `20s`, `0s`;
/// sub-second parts as milliseconds (`1.5s`).
pub(super) fn go_duration(duration: Duration) -> String {
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    let millis = duration.subsec_millis();
    let mut out = String::new();
    if hours > 0 {
        out = format!("{hours}h");
    }
    if hours > 0 || minutes > 0 {
        out = format!("{out}{minutes}m");
    }
    if millis > 0 {
        let fraction = format!("{millis:03}");
        format!("{out}{seconds}.{}s", fraction.trim_end_matches('0'))
    } else {
        format!("{out}{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::config::parse_duration;

    #[test]
    fn durations_read_back_as_written() {
        for (duration, text) in [
            (Duration::from_secs(20), "20s"),
            (Duration::from_mins(1), "1m0s"),
            (Duration::from_hours(4), "4h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(go_duration(duration), text);
            assert_eq!(parse_duration(text).expect("parses"), duration);
        }
    }

    #[test]
    fn configz_names_fields_like_a_config_file() {
        let config = KubeletConfiguration::default();
        let body = config.configz();
        let kc = &body["kubeletconfig"];
        assert_eq!(kc["kind"], "KubeletConfiguration");
        assert_eq!(kc["port"], 10250);
        assert_eq!(kc["readOnlyPort"], 0);
        assert_eq!(kc["syncFrequency"], "1m0s");
        assert_eq!(kc["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(kc["authorization"]["mode"], "AlwaysAllow");
        assert_eq!(
            kc["authorization"]["webhook"]["cacheUnauthorizedTTL"],
            "30s"
        );
    }
}
