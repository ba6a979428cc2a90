"""The runtime process role (``aotx boot``): device, journal emitter, executor, service socket."""
