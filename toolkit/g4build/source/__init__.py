"""Stage 2, source: the pin's source tree (sdist or git, verified), the Windows fork's base ported onto it, and
the git plumbing (``git merge-file``, tree helpers) the later stages share."""
