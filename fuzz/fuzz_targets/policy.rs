//! The policy file: any text is either a valid policy or a list of diagnostics, never a panic;
//! every diagnostic is one line naming a position inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_core::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Policy::from_yaml(text, "fuzz.yaml") {
        Ok(policy) => {
            let _ = policy.static_plan();
            for region in &policy.steering.regions {
                let _ = region.weights();
            }
            for pin in &policy.steering.pins {
                let _ = pin.weights();
            }
        }
        Err(e) => {
            // YAML breaks lines at \n, \r\n and a lone \r.
            let lines = text.bytes().filter(|b| matches!(b, b'\n' | b'\r')).count() + 1;
            for d in e.diagnostics() {
                assert!(d.position.line >= 1 && d.position.line <= lines + 1, "{d}");
                assert!(!d.to_string().contains('\n'), "{d:?}");
            }
        }
    }
});
