"""The admin plane (``/admin/*``): configuration writes, each propagated to every worker."""
