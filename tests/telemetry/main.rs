//! Telemetry end to end (filled in below).
