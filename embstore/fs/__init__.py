"""File safety: writes beside a destination renamed into place (``atomic``, ``beside``),
bounded and regular-file-only reads (``files``), state renewed after ``fork`` (``forksafe``)."""
