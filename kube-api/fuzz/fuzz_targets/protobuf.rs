//! Fuzzes `spinlink_kube_api::protobuf::fuzz_decode`: any request or answer
//! body sent as `application/vnd.kubernetes.protobuf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_kube_api::protobuf::fuzz_decode(data);
});
