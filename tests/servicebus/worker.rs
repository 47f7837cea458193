//! The runtime end to end over the emulator.
