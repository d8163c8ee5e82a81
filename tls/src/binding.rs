//! A value that names one TLS connection, derived with the TLS exporter
//! (RFC 5705 / RFC 8446 §7.5): both ends can compute it, nobody else can, and
//! no other connection shares it. Channel tokens are bound to it so that a
//! token copied to another connection is worthless.

use rustls::ConnectionCommon;

/// The exporter label spinlink uses for channel bindings.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-spinlink-channel-binding";

/// Length of a connection binding in bytes.
pub const BINDING_LEN: usize = 32;

/// A connection's binding value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionBinding(pub [u8; BINDING_LEN]);

impl std::fmt::Debug for ConnectionBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A binding is not secret on its own, but there is no reason to log it.
        f.write_str("ConnectionBinding(..)")
    }
}

/// Derives the binding of an established TLS connection.
pub fn connection_binding<D>(conn: &ConnectionCommon<D>) -> crate::Result<ConnectionBinding> {
    let mut out = [0u8; BINDING_LEN];
    conn.export_keying_material(&mut out, EXPORTER_LABEL, None)?;
    Ok(ConnectionBinding(out))
}
