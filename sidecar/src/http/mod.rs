//! HTTP shared by every port the sidecar serves: the response body type
//! and the one place a `metav1.Status` becomes a response ([`body`]), and
//! the accept-and-drain loop of a listener ([`serve`]). It knows nothing
//! of accounts; the facade, the REST APIs, ownership, the handover and the
//! peer port build on it.

pub mod body;
pub mod serve;
