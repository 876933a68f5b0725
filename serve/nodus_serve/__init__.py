"""The Ray Serve application of nodus: the REST API's ingress deployment."""

__all__: list[str] = []
