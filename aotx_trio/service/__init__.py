"""The service socket's shared side: ``wire`` (framing and the sans-IO connection both
ends use), ``client`` (the device client a gateway holds: in-process or over the
socket) and ``pushed`` (an item encoded once for many stream subscribers).  Below
both process roles: the runtime serves this protocol, the gateway speaks it.
"""
