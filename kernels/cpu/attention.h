/* attention kernels: declarations over real/K(), see kernels.h. */
