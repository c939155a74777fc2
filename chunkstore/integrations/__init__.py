"""chunkstore inside other inference engines: ``sglang`` (a HiCache storage backend). Each module
imports its engine and is loaded by that engine only; they use the store's public methods."""
