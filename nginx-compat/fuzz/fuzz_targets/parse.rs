//! Any bytes, as a main configuration file: tokenizer, block reader and
//! resolver, strict and lenient. Returning an error is fine; panicking,
//! overflowing the stack or running away is not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spinlink_nginx_compat::{Ast, Ingress, Options, parse_str};

fuzz_target!(|data: &[u8]| {
    // The byte-level entry: nginx reads bytes, not UTF-8.
    if let Ok(ast) = Ast::parse(data, "/fuzz/nginx.conf") {
        let _ = Ingress::from_ast(&ast, &Options::new());
    }
    // The public text entry, lenient as `spinlink nginx convert --lenient`.
    let text = String::from_utf8_lossy(data);
    let _ = parse_str(&text, "/fuzz/nginx.conf", &Options::new().lenient(true));
});
