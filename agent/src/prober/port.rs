//! A probe's or hook's port, by number or by the name of one of the container's ports (the kubelet's
//! `probe.ResolveContainerPort`), with its error texts: a name the container does not declare falls
//! back to reading the name as a number, so it fails with Go's `strconv.Atoi` message.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why a port reference does not name a usable port.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// Neither a declared port name nor a number.
    #[error("strconv.Atoi: parsing {0:?}: invalid syntax")]
    NotANumber(String),
    #[error("strconv.Atoi: parsing {0:?}: value out of range")]
    OutOfRange(String),
    #[error("invalid port number: {0}")]
    Invalid(i64),
}

/// The port number `port` refers to for `container`.
pub fn resolve_container_port(port: &IntOrString, container: &Container) -> Result<u16, PortError> {
    let number = match port {
        IntOrString::Int(number) => i64::from(*number),
        IntOrString::String(name) => match find_port_by_name(container, name) {
            Some(number) => i64::from(number),
            None => parse_go_int(name)?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(PortError::Invalid(number))
}

fn find_port_by_name(container: &Container, name: &str) -> Option<i32> {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// Go's `strconv.Atoi` for the decimal forms it accepts (an optional sign, digits).
fn parse_go_int(text: &str) -> Result<i64, PortError> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PortError::NotANumber(text.to_owned()));
    }
    text.parse::<i64>()
        .map_err(|_| PortError::OutOfRange(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerPort;

    use super::*;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        }
    }

    #[test]
    fn numbers_names_and_numeric_strings_resolve() {
        let c = container();
        assert_eq!(resolve_container_port(&IntOrString::Int(81), &c), Ok(81));
        assert_eq!(
            resolve_container_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
    }

    #[test]
    fn bad_references_fail_with_the_kubelets_messages() {
        let c = container();
        let missing = resolve_container_port(&IntOrString::String("metrics".into()), &c);
        assert_eq!(
            missing.unwrap_err().to_string(),
            "strconv.Atoi: parsing \"metrics\": invalid syntax"
        );
        assert_eq!(
            resolve_container_port(&IntOrString::Int(0), &c)
                .unwrap_err()
                .to_string(),
            "invalid port number: 0"
        );
        assert_eq!(
            resolve_container_port(&IntOrString::Int(70000), &c),
            Err(PortError::Invalid(70000))
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("-1".into()), &c),
            Err(PortError::Invalid(-1))
        );
        assert_eq!(
            resolve_container_port(&IntOrString::String("99999999999999999999".into()), &c),
            Err(PortError::OutOfRange("99999999999999999999".into()))
        );
    }
}
