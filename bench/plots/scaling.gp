# Stages vs speed (emulated devices): speedup over one stage at the same M against K,
# one panel per M, one line per schedule (from the K = 1 baseline); the textbook ideal
# K*M/(M+K-1) dashed, each schedule's simulated bound dotted in its colour, GPipe's
# published K = 8 figures as stars. Call with
#   gnuplot -e "data='scaling.dat'; out='scaling.png'; title_text='...'" scaling.gp
# scaling.dat: K M schedule measured_speedup ideal bound tokens_per_s, one block per
# (schedule, M) from its K = 1 baseline (experiment_data.py scaling).
if (!exists("title_text")) title_text = "Stages vs speed (emulated)"
set terminal pngcairo size 1100,800 font "DejaVu Sans,10"
set output out
set termoption noenhanced
schedules = "gpipe 1f1b interleaved zb-h1 zb-v dualpipe-v"
colours = "#4C72B0 #DD8452 #55A868 #C44E52 #937860 #DA8BC3"
set multiplot layout 2,2 title title_text
set logscale x 2
set xrange [0.8:10]
set xtics (1, 2, 4, 8)
set xlabel "stages K"
set ylabel "speedup over K = 1"
set grid lc rgb "#eeeeee"
set key bottom right box opaque font ",8" spacing 0.8 samplen 2
do for [m in "1 4 8 32"] {
  M = m + 0
  set title sprintf("M = %d micro-batches", M)
  set yrange [0:*]
  paper = (M == 1 ? 1.38 : (M == 4 ? 1.72 : (M == 32 ? 3.48 : NaN)))
  paper_title = (M == 8 ? "" : "GPipe paper, K = 8 (real compute)")
  ideal(k) = k * M / (M + k - 1.0)
  set samples 100
  plot ideal(x) with lines dt 2 lw 2 lc rgb "black" title "ideal K·M/(M+K-1)", \
       for [i = 1:words(schedules)] data using ($2 == M && strcol(3) eq word(schedules, i) ? $1 : 1/0):4 \
         with linespoints pt 7 lw 2 lc rgb word(colours, i) title word(schedules, i), \
       for [i = 1:words(schedules)] data using ($2 == M && strcol(3) eq word(schedules, i) ? $1 : 1/0):6 \
         with lines dt 3 lc rgb word(colours, i) notitle, \
       '+' using (8):(paper) every ::0::0 with points pt 3 ps 2.5 lc rgb "#8172B3" \
         title paper_title
}
unset multiplot
