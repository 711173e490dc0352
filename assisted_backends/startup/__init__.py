"""What both command lines (`run-assisted-generation`, `assisted-serve`) do before they generate: the model, device
and draft-length flags and their checks (`flags`, `checks`, `model_files`, `machine`: no torch), the default draft
(`default_draft`), which models the flags name (`choice`), the process's settings before torch loads
(`environment`), the thread count (`threads`), and the pair opened through `loading.open` on a backend (`pair`)."""
