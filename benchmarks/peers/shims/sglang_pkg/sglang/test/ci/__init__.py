# shim for a side-by-side run, not SGLang's code (empty package marker)
