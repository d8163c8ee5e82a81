//! `Table` output for any resource: custom resources with their CRD version's
//! `additionalPrinterColumns` (or `Age` when it has none), built-in ones with
//! the server's printers, both from `kube-api`'s shared `table` module.

use chrono::Utc;
use serde_json::Value;

use crate::resources::{PrinterColumn, ResourceInfo};
use crate::table::{self, IncludeObject};

/// A Table of `objects` of any resource, as of now.
pub(crate) fn any_table<'a>(
    res: &ResourceInfo,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
) -> Value {
    let now = Utc::now();
    match res.custom {
        Some(c) => {
            let mut columns = c.printer_columns.clone();
            if columns.is_empty() {
                columns.push(PrinterColumn::age());
            }
            table::custom_table(res.api(), &columns, objects, list_meta, include, now)
        }
        None => table::table(res.api(), objects, list_meta, include, now),
    }
}
