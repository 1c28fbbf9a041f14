class NodeArg:
    name: str
    type: str
    shape: list[int | str | None] | None
    def __init__(self, name: str, type: str, shape: list[int | str | None] | None) -> None: ...

class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]
    def __init__(self, producer_name: str, graph_name: str, domain: str, description: str,
                 graph_description: str, version: int, custom_metadata_map: dict[str, str]) -> None: ...
