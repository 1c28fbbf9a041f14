from typing import Any

import numpy as np

def numpy_dtype_for_element_type(elem_type: int) -> np.dtype[Any]: ...

# (for ortagent's other modules) an ONNX element type from an int, a 'tensor(float)' string or a
# NumPy dtype-like
def element_type_from(element_type: object) -> int: ...
