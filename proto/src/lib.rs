//! spinlink's wire contract: the `spinlink.v1.Tunnel` gRPC service that agents
//! call on a gateway, and the messages of its `Hello`, `Cache`, `Relay`,
//! `Control` and `Assignments` methods. Start with `proto/spinlink/v1/tunnel.proto`; this crate only holds
//! the code generated from it and the names of the stream headers.
#![forbid(unsafe_code)]

/// Generated code for package `spinlink.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("spinlink.v1");

    // Channel tokens are credentials: a `{:?}` of a grant (or of a whole
    // `HelloResponse`) must not print them.
    impl std::fmt::Debug for ChannelGrant {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ChannelGrant")
                .field("account", &self.account)
                .field("token", &"<redacted>")
                .field("expires_at_unix", &self.expires_at_unix)
                .finish()
        }
    }

    // A kubeconfig is a credential: `{:?}` shows its size only.
    impl std::fmt::Debug for AccountAssigned {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("AccountAssigned")
                .field("name", &self.name)
                .field(
                    "kubeconfig",
                    &format_args!("<{} bytes redacted>", self.kubeconfig.len()),
                )
                .field("context", &self.context)
                .field("namespaces", &self.namespaces)
                .finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::v1::{AccountAssigned, ChannelGrant, HelloResponse};

    #[test]
    fn debug_of_an_assignment_hides_the_kubeconfig() {
        let assigned = AccountAssigned {
            name: "prod".into(),
            kubeconfig: b"token: s3cr3t-kubeconfig-token".to_vec(),
            ..Default::default()
        };
        let printed = format!("{assigned:?}");
        assert!(printed.contains("prod"));
        assert!(!printed.contains("s3cr3t"), "{printed}");
    }

    #[test]
    fn debug_of_a_hello_response_hides_tokens() {
        let response = HelloResponse {
            granted: vec![ChannelGrant {
                account: "prod".into(),
                token: "s3cr3t-token-value".into(),
                expires_at_unix: 1,
            }],
            ..Default::default()
        };
        let printed = format!("{response:?}");
        assert!(printed.contains("prod"));
        assert!(!printed.contains("s3cr3t-token-value"), "{printed}");
    }
}

/// The largest `spinlink.v1` message a sidecar decodes (and, by default, a
/// gateway carries): gRPC's customary 4 MiB, stated rather than inherited.
/// A watch event holds one object, which the API server keeps under
/// 1.5 MiB; relayed bodies travel in chunks.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// HTTP/2 header names carried on `Cache` and `Relay` streams.
pub mod headers {
    /// Sent by the agent: the account a stream serves.
    pub const ACCOUNT: &str = "spinlink-account";
    /// Sent by the agent: the channel token for that account. Never forwarded
    /// upstream by the gateway.
    pub const TOKEN: &str = "spinlink-token";
    /// Prefix of the headers only the gateway may set; removed from agent input.
    pub const VERIFIED_PREFIX: &str = "spinlink-verified-";
    /// Set by the gateway: the agent identity proven by its certificate.
    pub const VERIFIED_IDENTITY: &str = "spinlink-verified-identity";
    /// Set by the gateway: the account the channel token was checked against.
    pub const VERIFIED_ACCOUNT: &str = "spinlink-verified-account";
    /// Sent by the agent on `Assignments`: its agent id, as in its `Hello`.
    pub const AGENT_ID: &str = "spinlink-agent-id";
    /// Set by the gateway on `Assignments`: the agent id the connection's
    /// `Hello` stated.
    pub const VERIFIED_AGENT: &str = "spinlink-verified-agent";
    /// Set by the gateway on `Assignments`: a JSON array of the account
    /// globs (`*` does not cross `/`) the agent's identity may serve. The
    /// sidecar assigns it no other account.
    pub const VERIFIED_ACCOUNTS: &str = "spinlink-verified-accounts";
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2`) in a discovery snapshot.
pub mod aggregated {
    /// What the agent asks for: `v2`, what kubectl 1.30 and later ask for
    /// first. A client asking only for another version (kubectl 1.27–1.29:
    /// `v2beta1`) is answered the plain document, as a server would.
    pub const ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    /// The media-type parameter that marks an aggregated answer.
    pub const MARK: &str = "as=APIGroupDiscoveryList";
    /// Appended to `/api` and `/apis` to name their aggregated documents in
    /// a snapshot: a sidecar that does not know them never serves them in
    /// place of the plain ones (no request path contains it).
    pub const PATH_SUFFIX: &str = ";as=APIGroupDiscoveryList";
}

/// Full gRPC paths of the `Tunnel` methods, as routed by the gateway.
pub mod paths {
    /// `Hello`, answered by the gateway itself.
    pub const HELLO: &str = "/spinlink.v1.Tunnel/Hello";
    /// `Cache`, checked and carried to a sidecar.
    pub const CACHE: &str = "/spinlink.v1.Tunnel/Cache";
    /// `Relay`, checked and carried to a sidecar.
    pub const RELAY: &str = "/spinlink.v1.Tunnel/Relay";
    /// `Control`, answered by the gateway itself.
    pub const CONTROL: &str = "/spinlink.v1.Tunnel/Control";
    /// `Assignments`, checked and carried to a sidecar.
    pub const ASSIGNMENTS: &str = "/spinlink.v1.Tunnel/Assignments";
}
