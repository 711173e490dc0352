"""Loading models from what users pass: saved directories, Hub ids, `.gguf` files."""
