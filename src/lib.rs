//! criu-cuda-migrate plugin shell. TODO
