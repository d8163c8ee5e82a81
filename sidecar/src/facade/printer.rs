//! Which printer a Table of a cached kind is rendered with: the API server's
//! built-in printers for the kinds spinlink knows them for, the columns a
//! cached CustomResourceDefinition declares for custom resources. For any
//! other kind (a custom resource whose CRD is not cached, a built-in kind
//! without a known printer) the facade cannot print what the server would,
//! so the request is relayed.

use chrono::{DateTime, Utc};
use serde_json::Value;
use spinlink_kube_api::Resource;
use spinlink_kube_api::table::{self, IncludeObject, PrinterColumn};

use crate::cache::{Cache, Entry};

/// How the rows of a Table are printed.
#[derive(Debug, Clone)]
pub enum Printer {
    /// The server's printer for a built-in kind.
    BuiltIn,
    /// The `additionalPrinterColumns` of the custom resource's CRD version.
    Custom(Vec<PrinterColumn>),
}

/// The printer for `res`, or `None` when the facade cannot print it as the
/// server would.
pub fn printer(cache: &Cache, res: Resource<'_>) -> Option<Printer> {
    if let Some(crd) = crd(cache, res) {
        let columns = PrinterColumn::of_crd(&crd.object(), res.version)?;
        return Some(Printer::Custom(columns));
    }
    table::has_printer(res).then_some(Printer::BuiltIn)
}

/// The cached CustomResourceDefinition of `res`, if it is a custom
/// resource whose CRD the agent sent.
fn crd<'a>(cache: &'a Cache, res: Resource<'_>) -> Option<&'a Entry> {
    let crds = cache.kind("apiextensions.k8s.io", "v1", "customresourcedefinitions")?;
    crds.objects
        .get(&(String::new(), format!("{}.{}", res.plural, res.group)))
}

/// Whether `res` is a custom resource: its CustomResourceDefinition is
/// cached, or (not cached) its group is not one of Kubernetes' own (`core`,
/// a name without a dot, or `*.k8s.io`). A custom resource's LIST is
/// unstructured, its items whole (apimachinery's
/// `pkg/apis/meta/v1/unstructured/unstructured_list.go`,
/// `UnstructuredList.UnstructuredContent`).
pub fn is_custom(cache: &Cache, res: Resource<'_>) -> bool {
    crd(cache, res).is_some() || (res.group.contains('.') && !res.group.ends_with(".k8s.io"))
}

/// A Table of `objects` of `res`, printed by `printer`.
pub fn render<'a>(
    printer: &Printer,
    res: Resource<'_>,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    match printer {
        Printer::BuiltIn => table::table(res, objects, list_meta, include, now),
        Printer::Custom(columns) => {
            table::custom_table(res, columns, objects, list_meta, include, now)
        }
    }
}
