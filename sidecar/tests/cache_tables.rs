//! Tables of custom resources from the cache: printed with the cached CRD's
//! `additionalPrinterColumns`, compared with what a real kube-apiserver 1.36
//! answered for the same objects (`kube-sim/fixtures/tables/`), and relayed
//! when the CRD is not cached.

mod common;

use common::*;
use serde_json::Value;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[tokio::test]
async fn custom_resources_print_their_crds_columns() -> anyhow::Result<()> {
    let want = fixture("tables/gadgets.includeObject-Object.table.json");
    let gadgets: Vec<Value> = want["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["object"].clone())
        .collect();

    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let mut cache = CacheStream::open(&mut client, "prod").await?;
    let gadget_kind = kind("fx.example.com", "v1", "gadgets", "Gadget", true);
    sync(&mut cache, &gadget_kind, &gadgets).await?;
    cache.wait_acked().await?;
    let http = http();
    let url = sidecar.url(
        "/accounts/prod/apis/fx.example.com/v1/namespaces/fx-tables/gadgets?includeObject=Object",
    );

    // Without the CRD the facade cannot print what the server would: the
    // request is relayed (and this account has no relay).
    let relayed = request(&http, "GET", &url, &[("accept", TABLE)], "").await?;
    assert_eq!(relayed.status, 503);
    // Plain lists are still answered from the cache.
    let list = request(&http, "GET", &url, &[("accept", "application/json")], "").await?;
    assert_eq!(list.status, 200);

    let crds = kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
    );
    sync(
        &mut cache,
        &crds,
        &[fixture("tables/gadgets.crd.reconstructed.json")],
    )
    .await?;
    cache.wait_acked().await?;
    let got = request(&http, "GET", &url, &[("accept", TABLE)], "").await?;
    assert_eq!(got.status, 200);
    let got = got.json();
    assert_eq!(got["columnDefinitions"], want["columnDefinitions"]);
    let rows = |t: &Value| t["rows"].as_array().unwrap().clone();
    assert_eq!(rows(&got).len(), rows(&want).len());
    let cols = want["columnDefinitions"].as_array().unwrap();
    for (g, w) in rows(&got).iter().zip(&rows(&want)) {
        assert_eq!(g["object"], w["object"]);
        for (i, col) in cols.iter().enumerate() {
            let (gc, wc) = (&g["cells"][i], &w["cells"][i]);
            if col["type"] == "date" {
                // Ages depend on the clock, which here is the test's, not the
                // recording's: the same cells are empty, the others ages.
                assert_eq!(gc.is_null(), wc.is_null(), "{}", col["name"]);
            } else {
                assert_eq!(gc, wc, "{} of {}", col["name"], w["cells"][0]);
            }
        }
    }
    sidecar.stop().await
}
