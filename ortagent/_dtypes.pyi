from typing import Any

import numpy as np

def numpy_dtype_for_element_type(elem_type: int) -> np.dtype[Any]: ...
